// One app's faults stay its own (issue 10): through a real daemon, two client apps (the same uid, different app
// names) get their own workers of a `perApp` extension, so one app's crash-inducing input and crash loop never
// interrupt the other's request; `shared` opts back into one set of workers.
import SDKWire
import HostTestSupport
import SDKHost
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct IsolationTests {
    /// Begins a request with a recorder of its own, noting the worker pid the daemon assigned it.
    static func run(_ ext: Extension, _ title: String) -> (RequestID, Recorder, AssignedPid) {
        let recorder = Recorder()
        recorder.attach(to: ext)
        let (id, pid) = beginNotingPid(ext, title)
        return (id, recorder, pid)
    }

    @Test func oneAppsCrashDoesNotInterruptAnotherAppsRequest() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let alpha = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "alpha")
        let beta = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "beta")
        let alphaCrasher = try alpha.extension(identifier: "com.example.crasher")
        let betaCrasher = try beta.extension(identifier: "com.example.crasher")

        let (slow, recorder, alphaPid) = Self.run(alphaCrasher, "slow:1500")
        #expect(await eventually { alphaPid.pid != 0 })
        let (segv, betaRecorder, betaPid) = Self.run(betaCrasher, "segv")
        #expect(await betaRecorder.wait(for: segv) == .interrupted(.signal(SIGSEGV)))
        #expect(await recorder.wait(for: slow) == .completed([ExtensionItem(title: "slow:1500")]))
        #expect(alphaPid.pid != betaPid.pid, "each app has its own worker")

        // Beta loops into quarantine; alpha is untouched by it.
        for _ in 0..<5 {
            await #expect(throws: RequestFailure.self) { try await betaCrasher.perform([ExtensionItem(title: "abort")]) }
        }
        await #expect(throws: RequestFailure.interrupted(.quarantined)) {
            try await betaCrasher.perform([ExtensionItem(title: "echo")])
        }
        #expect(try await alphaCrasher.perform([ExtensionItem(title: "echo")]) == [ExtensionItem(title: "echo")])

        let status = try #require(await alpha.status())
        let crasher = try #require(status.extensions.first { $0.identifier == "com.example.crasher" })
        let uid = getuid()
        let betaPool = try #require(crasher.pools.first { $0.app == "\(uid)/beta" })
        #expect(betaPool.state == .quarantined && betaPool.crashCount >= 5 && (betaPool.retryInSeconds ?? 0) > 0)
        #expect(crasher.pools.first { $0.app == "\(uid)/alpha" }?.state == .running)
        #expect(crasher.state == .quarantined)
        #expect(crasher.workers.contains { $0.app == "\(uid)/alpha" })
        await alpha.shutdown()
        await beta.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func sharedWorkersServeEveryApp() async throws {
        let shared = TemporaryExtension(identifier: "com.example.shared-echo", executable: "Echo",
                                        policy: "<key>WorkerSharing</key><string>shared</string><key>MaxWorkers</key><integer>1</integer>")
        defer { shared.remove() }
        let daemon = try await DaemonProcess(extraSearchPaths: [shared.root])
        defer { daemon.remove() }
        let alpha = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "alpha")
        let beta = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "beta")
        let (a, ra, pa) = Self.run(try alpha.extension(identifier: "com.example.shared-echo"), "a")
        let (b, rb, pb) = Self.run(try beta.extension(identifier: "com.example.shared-echo"), "b")
        #expect(await ra.wait(for: a) == .completed([ExtensionItem(title: "a")]))
        #expect(await rb.wait(for: b) == .completed([ExtensionItem(title: "b")]))
        #expect(pa.pid == pb.pid && pa.pid != 0)
        await alpha.shutdown()
        await beta.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func warmWorkersAndPrewarmThroughTheDaemon() async throws {
        let warm = TemporaryExtension(identifier: "com.example.warm-echo", executable: "Echo",
                                      policy: "<key>MinWarmWorkers</key><integer>1</integer>")
        defer { warm.remove() }
        let daemon = try await DaemonProcess(extraSearchPaths: [warm.root])
        defer { daemon.remove() }
        let alpha = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "alpha")
        func workers() async -> [WorkerStatus] {
            await alpha.status(of: "com.example.warm-echo")?.workers ?? []
        }
        // A spare before any request, serving no app.
        #expect(await eventually { await workers().count == 1 })
        let spare = try #require(await workers().first)
        #expect(spare.app == nil && spare.requestsServed == 0)
        // Alpha's first request adopts it, and a new spare takes its place.
        let (id, recorder, pid) = Self.run(try alpha.extension(identifier: "com.example.warm-echo"), "first")
        #expect(await recorder.wait(for: id) == .completed([ExtensionItem(title: "first")]))
        #expect(pid.pid == spare.pid)
        #expect(await eventually {
            let all = await workers()
            return all.count == 2 && all.contains { $0.app == nil && $0.pid != spare.pid }
        })
        // prewarm() through the daemon: beta gets a ready worker of its own before its first request.
        let beta = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "beta")
        let echo = try beta.extension(identifier: "com.example.echo")
        let prewarmed = try await echo.prewarm()
        let (b, rb, pb) = Self.run(echo, "b")
        #expect(await rb.wait(for: b) == .completed([ExtensionItem(title: "b")]))
        #expect(pb.pid == prewarmed)
        await alpha.shutdown()
        await beta.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func requestAppNamesTheAppFromTheCommandLine() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let out = "\(daemon.folder)/out"
        let pid = spawnProgram([sdkHostBinary, "request", "com.example.echo", "--socket", daemon.socket, "--app", "gamma",
                                "--text", "hi"], stdout: out)
        #expect(await waitExit(pid) == 0)
        let host = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "observer")
        let status = try #require(await host.status())
        let echo = try #require(status.extensions.first { $0.identifier == "com.example.echo" })
        #expect(echo.pools.contains { $0.app == "\(getuid())/gamma" }, "\(echo.pools)")
        let json = "\(daemon.folder)/json"
        let statusPid = spawnProgram([sdkHostBinary, "status", "--json", "--socket", daemon.socket], stdout: json)
        #expect(await waitExit(statusPid) == 0)
        let text = readSmallFile(json) ?? ""
        #expect(text.contains("\"app\":\"\(getuid())/gamma\"") && text.contains("\"hangRatePer1000\""), "\(text)")
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }
}

