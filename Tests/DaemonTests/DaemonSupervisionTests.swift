// Supervision through the daemon (issue 10): the same promises as the embedded SupervisionTests, checked the
// way an operator sees them, with `sdk-host status --json` and `sdk-host status` run as real commands.
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension HostStatus {
    /// Runs `sdk-host status --json` against the daemon and reads what it printed back into the one status model
    /// with Foundation's JSONDecoder: a reader independent of the plist coder that produced it.
    static func read(_ daemon: DaemonProcess) async throws -> HostStatus {
        try await decodeOutput(HostStatus.self, of: [sdkHostBinary, "status", "--json", "--socket", daemon.socket],
                               in: daemon.folder)
    }

    subscript(_ identifier: String) -> ExtensionStatus? { extensions.first { $0.identifier == identifier } }
}

@Suite(.serialized) struct DaemonSupervisionTests {
    @Test func anExtensionThatAbortsAtStartIsQuarantinedAndShownSo() async throws {
        // The manifest's Environment key makes the bundled Crasher abort before its handshake.
        let looping = TemporaryExtension(identifier: "com.example.aborts-at-start", executable: "Crasher", policy: """
            <key>Environment</key><dict><key>CRASHER_FAULT_AT_START</key><string>abort</string></dict>
            <key>QuarantineSeconds</key><integer>60</integer>
            """)
        defer { looping.remove() }
        let daemon = try await DaemonProcess(extraSearchPaths: [looping.root])
        defer { daemon.remove() }
        let host = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "looper")
        let ext = try host.extension(identifier: looping.identifier)
        var quarantined = 0
        var slowest = 0.0
        for _ in 0..<40 {
            let start = monotonicNanoseconds()
            do {
                _ = try await ext.perform([ExtensionItem(title: "echo")])
                Issue.record("a worker that aborts at start completed a request")
            } catch RequestFailure.interrupted(.quarantined) {
                quarantined += 1
                slowest = max(slowest, Double(monotonicNanoseconds() - start) / 1e9)
            } catch {}
        }
        #expect(quarantined >= 30)
        #expect(slowest < 2, "a quarantined request ends at once (took \(slowest) s)")

        let status = try await HostStatus.read(daemon)
        let entry = try #require(status[looping.identifier])
        #expect(entry.state == .quarantined && entry.crashCount >= 5)
        #expect((entry.retryInSeconds ?? 0) > 30, "\(String(describing: entry.retryInSeconds))")
        #expect(entry.spawns <= 10, "spawns: \(entry.spawns)")
        #expect(entry.interruptionsByReason["quarantined"] == quarantined)
        #expect(status["com.example.echo"]?.state == .running, "other extensions are not touched")

        // The human table names the state and when the next try comes.
        let out = "\(daemon.folder)/status.txt"
        let pid = spawnProgram([sdkHostBinary, "status", "--socket", daemon.socket], stdout: out)
        #expect(await waitExit(pid) == 0)
        let line = (readSmallFile(out) ?? "").split(separator: "\n").first { $0.hasPrefix(looping.identifier) } ?? ""
        #expect(line.contains("quarantined ") && line.contains("s "), "\(line)")
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func recyclingHangReportsAndLivenessThroughTheDaemon() async throws {
        let recycled = TemporaryExtension(identifier: "com.example.recycled", executable: "Crasher",
                                          policy: "<key>MaxRequestsPerWorker</key><integer>5</integer>")
        defer { recycled.remove() }
        let daemon = try await DaemonProcess(extraSearchPaths: [recycled.root])
        defer { daemon.remove() }
        let host = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "ops")

        // Recycling: 16 requests, 5 per worker, all complete on at least 3 workers.
        let ext = try host.extension(identifier: recycled.identifier)
        let recorder = Recorder()
        recorder.attach(to: ext)
        let begun = (0..<16).map { n in beginNotingPid(ext, n % 2 == 0 ? "slow:30" : "echo") }
        let outcomes = try #require(await recorder.wait(for: begun.map(\.0)))
        #expect(outcomes.values.allSatisfy { kind($0) == "completed" }, "\(outcomes.values)")
        #expect(Set(begun.map(\.1.pid)).count >= 3, "served by \(Set(begun.map(\.1.pid)))")

        // Hang report: one request of 400 ms among four.
        let crasher = try host.extension(identifier: "com.example.crasher")
        _ = try await crasher.perform([ExtensionItem(title: "slow:400")])
        for _ in 0..<3 { _ = try await crasher.perform([ExtensionItem(title: "echo")]) }

        // Liveness: a worker that stops itself is killed within seconds by the default heartbeat settings.
        let start = monotonicNanoseconds()
        await #expect(throws: RequestFailure.self) {
            try await crasher.perform([ExtensionItem(title: "stop")], deadline: 60)
        }
        let seconds = Double(monotonicNanoseconds() - start) / 1e9
        #expect(seconds < 9, "a stopped worker took \(seconds) s to be noticed")

        let status = try await HostStatus.read(daemon)
        let recycledEntry = try #require(status[recycled.identifier])
        #expect(recycledEntry.completions == 16 && recycledEntry.recycles >= 2, "\(recycledEntry)")
        let crasherEntry = try #require(status["com.example.crasher"])
        #expect(crasherEntry.slowRequests >= 1 && crasherEntry.slowRequestSeconds >= 0.4, "\(crasherEntry)")
        #expect(crasherEntry.interruptionsByReason["hang"] == 1, "\(crasherEntry.interruptionsByReason)")
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }
}
