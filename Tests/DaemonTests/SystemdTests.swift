// The daemon under systemd, with this test playing systemd's part: it makes the listening socket and passes it as
// fd 3 (LISTEN_PID/LISTEN_FDS), reads the sd_notify datagrams on a socket of its own, names the daemon's stderr in
// JOURNAL_STREAM, asks for watchdog pings, and sends SIGHUP after changing the manifests.
import Foundation
import SDKWire
import SDKHost
import SDKPosix
import Testing
import HostTestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A datagram socket bound in a folder the test made: what systemd's NOTIFY_SOCKET is.
final class NotifyListener {
    let path: String
    let fd: Int32
    private(set) var received: [String] = []

    init(path: String) throws {
        self.path = path
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemError("socket", errno: errno) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, byte) in path.utf8.prefix(raw.count - 1).enumerated() { raw[i] = byte }
        }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard rc == 0 else { throw SystemError("bind", errno: errno, detail: path) }
    }

    deinit { close(fd) }

    /// Reads what has arrived.
    func drain() {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            guard n > 0 else { return }
            received.append(String(decoding: buffer[0..<n], as: UTF8.self))
        }
    }

    /// Waits until a datagram satisfies `match`; returns it.
    func wait(timeout: Double = 30, _ match: (String) -> Bool) async -> String? {
        let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
        while monotonicNanoseconds() < deadline {
            drain()
            if let hit = received.first(where: match) { return hit }
            try? await Task.sleep(nanoseconds: 20_000_000)
        }
        return nil
    }
}

@Suite(.serialized) struct SystemdTests {
    @Test func socketActivationNotifyWatchdogAndJournalLines() async throws {
        let own = try TemporaryFolder()
        let notify = try NotifyListener(path: "\(own.path)/notify")
        let journal = "\(own.path)/journal.log"
        writeFile(journal, "")
        var st = stat()
        #expect(stat(journal, &st) == 0)
        let daemon = try await DaemonProcess(
            stderrPath: journal,
            environment: ["NOTIFY_SOCKET='\(notify.path)'", "JOURNAL_STREAM=\(st.st_dev):\(st.st_ino)", "WATCHDOG_USEC=200000"],
            socketActivated: true)
        defer { daemon.remove() }

        // Readiness, with the daemon's pid and the inherited socket in STATUS=.
        let ready = await notify.wait { $0.contains("READY=1") }
        #expect(ready?.contains("MAINPID=\(daemon.pid)") == true, "\(notify.received)")
        #expect(ready?.contains("STATUS=serving") == true && ready?.contains("activated.sock") == true, "\(ready ?? "")")

        // It serves on fd 3's socket and never bound the configured path.
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        let items = try await host.extension(identifier: "com.example.echo").perform([ExtensionItem(title: "activated")])
        #expect(items.first?.title == "activated")
        #expect(access("\(daemon.folder)/configured.sock", F_OK) != 0)
        if case .daemon(let path, let pid) = host.mode {
            #expect(path == daemon.socket && pid == daemon.pid)
        } else {
            Issue.record("a connected host reports mode \(host.mode)")
        }
        await host.shutdown()

        // Watchdog pings every half interval (100 ms): at least 3 in 2 s even on a loaded machine.
        try await Task.sleep(nanoseconds: 2_000_000_000)
        notify.drain()
        #expect(notify.received.filter { $0 == "WATCHDOG=1" }.count >= 3, "\(notify.received.count) datagrams")

        // Log lines for journald: a syslog priority prefix, no "sdk-host: info:" and no timestamp.
        let lines = (readSmallFile(journal) ?? "").split(separator: "\n")
        #expect(!lines.isEmpty)
        #expect(lines.allSatisfy { $0.hasPrefix("<") && $0.dropFirst(2).hasPrefix(">") }, "\(lines.prefix(3))")
        #expect(lines.contains { $0.hasPrefix("<6>serving") }, "\(lines.prefix(3))")

        // Stopping: STOPPING=1, exit 0, and the socket's path is left to systemd, which owns it.
        #expect(await daemon.stop() == 0)
        #expect(await notify.wait { $0.contains("STOPPING=1") } != nil)
        #expect(access(daemon.socket, F_OK) == 0)
    }

    @Test func fd3ThatIsNotAListeningSocketIsAClearError() async throws {
        let own = try TemporaryFolder()
        let err = "\(own.path)/err"
        let file = open("\(own.path)/plain", O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        defer { close(file) }
        let pid = spawnProgram([sdkHostBinary, "serve", "--socket", "\(own.path)/d.sock"], stderr: err,
                               environment: ["LISTEN_PID=$$", "LISTEN_FDS=1"], fd3: file)
        #expect(await waitExit(pid) == 2)
        #expect(readSmallFile(err)?.contains("fd 3 is not a listening Unix stream socket") == true, "\(readSmallFile(err) ?? "")")
    }

    @Test func sighupRescansManifestsAndTellsClients() async throws {
        let own = try TemporaryFolder()
        let notify = try NotifyListener(path: "\(own.path)/notify")
        let extra = "\(own.path)/extensions"
        mkdir(extra, 0o700)
        let daemon = try await DaemonProcess(extraSearchPaths: [extra], environment: ["NOTIFY_SOCKET='\(notify.path)'"])
        defer { daemon.remove() }
        #expect(await notify.wait { $0.contains("READY=1") } != nil)
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        #expect(!host.extensionIdentifiers.contains("com.example.reloaded"))
        let echo = try host.extension(identifier: "com.example.echo")
        let before = echo.start([ExtensionItem(title: "before")], deadline: .seconds(30))
        _ = try await before.value
        let oldPid = try #require(before.pid)

        // A new manifest appears (the Echo executable under another identifier and extension point); SIGHUP.
        mkdir("\(extra)/Reloaded", 0o700)
        // The Echo executable under another identifier and extension point, with `policy` in its SDKHostPolicy.
        func writeReloaded(policy: String = "") {
            writeFile("\(extra)/Reloaded/Info.plist", """
                <?xml version="1.0" encoding="UTF-8"?>
                <plist version="1.0"><dict>
                  <key>CFBundleIdentifier</key><string>com.example.reloaded</string>
                  <key>NSExtension</key><dict>
                    <key>NSExtensionPointIdentifier</key><string>com.example.reload-point</string>
                    <key>NSExtensionExecutable</key><string>Echo</string>
                    <key>SDKHostPolicy</key><dict>\(policy)</dict>
                  </dict>
                </dict></plist>
                """)
        }
        writeReloaded()
        daemon.signal(SIGHUP)
        #expect(await notify.wait { $0.contains("RELOADING=1") && $0.contains("MONOTONIC_USEC=") } != nil)
        #expect(await eventually(timeout: 20) { host.extensionIdentifiers.contains("com.example.reloaded") })
        #expect(host.extensions(forExtensionPoint: "com.example.reload-point").map(\.identifier) == ["com.example.reloaded"])
        let reloaded = try await host.extension(identifier: "com.example.reloaded").perform([ExtensionItem(title: "new")])
        #expect(reloaded.first?.title == "new")

        // The old echo worker was retired; the next echo request runs on a new one.
        let after = echo.start([ExtensionItem(title: "after")], deadline: .seconds(30))
        _ = try await after.value
        #expect(after.pid != nil && after.pid != oldPid)

        // A broken manifest is skipped, and says why; the others are served on.
        writeFile("\(extra)/Reloaded/Info.plist", "<plist><dict><key>CFBundleIdentifier</key></dict></plist>")
        daemon.signal(SIGHUP)
        #expect(await eventually(timeout: 20) {
            daemon.logText.contains("reload: \(extra)/Reloaded/Info.plist") && daemon.logText.contains("skipped, the other extensions are served")
        }, "\(daemon.logText)")
        #expect(try await echo.perform([ExtensionItem(title: "still")]).first?.title == "still")

        // One that names itself but breaks a rule is listed and refused by name, as an embedded host refuses it
        // (the client was sent the problem): before, `extension(identifier:)` took it, and each request was sent
        // to the daemon to end as a launch failure (`sdk-host request` exited 4 here, 2 when embedded).
        writeReloaded(policy: "<key>NetworkAllowed</key><integer>1</integer>")
        daemon.signal(SIGHUP)
        func refusal() -> HostError? {
            do { _ = try host.extension(identifier: "com.example.reloaded"); return nil } catch { return error }
        }
        // Listed again (the last step's manifest named no identifier), and refused saying why.
        #expect(await eventually(timeout: 20) { host.extensionIdentifiers.contains("com.example.reloaded") }, "\(daemon.logText)")
        let refused = refusal()
        #expect(refused?.code == .invalidManifest, "\(String(describing: refused))")
        #expect(refused?.detail.contains("\(extra)/Reloaded/Info.plist") == true
                    && refused?.detail.contains("NetworkAllowed: expected a boolean, found integer") == true, "\(String(describing: refused))")
        // Its status says so (the table shows it refused, `--json` and the API give the problem).
        let listed = await host.status()?.extensions.first { $0.identifier == "com.example.reloaded" }
        #expect(listed?.problem?.contains("NetworkAllowed: expected a boolean, found integer") == true, "\(String(describing: listed))")
        #expect(await host.status()?.extensions.first { $0.identifier == "com.example.echo" }?.problem == nil)
        // The CLI, through the daemon, says so and exits 2, as it does embedded.
        let err = "\(extra)/request.err"
        let pid = spawnProgram([sdkHostBinary, "request", "com.example.reloaded", "--socket", daemon.socket], stderr: err)
        #expect(await waitExit(pid) == 2)
        let message = String(decoding: try readFile(err), as: UTF8.self)
        #expect(message.contains("NetworkAllowed: expected a boolean, found integer"), "\(message)")
        #expect(try await echo.perform([ExtensionItem(title: "still")]).first?.title == "still")
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }

    /// SIGHUPs faster than reloads (a script's loop, a tool gone wrong) are coalesced: a reload comes at least a
    /// second after the last one ended, so clients keep being served. Before, each signal was a reload, and with
    /// thousands of manifests the loop did nothing else while a client's echo waited.
    @Test func aBurstOfSighupsIsAFewReloads() async throws {
        let own = try TemporaryFolder()
        let notify = try NotifyListener(path: "\(own.path)/notify")
        let daemon = try await DaemonProcess(environment: ["NOTIFY_SOCKET='\(notify.path)'"])
        defer { daemon.remove() }
        #expect(await notify.wait { $0.contains("READY=1") } != nil)
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        let start = monotonicNanoseconds()
        for _ in 0..<20 {
            daemon.signal(SIGHUP)
            try await Task.sleep(nanoseconds: 50_000_000)
        }
        let seconds = Int((monotonicNanoseconds() - start) / 1_000_000_000)
        try await Task.sleep(nanoseconds: 2_500_000_000)
        notify.drain()
        let reloads = notify.received.filter { $0.contains("RELOADING=1") }.count
        #expect((1...seconds + 2).contains(reloads), "\(reloads) reloads for 20 SIGHUPs in \(seconds)+ s")
        #expect(try await host.extension(identifier: "com.example.echo").perform([ExtensionItem(title: "on")]).first?.title == "on")
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func aSocketThatAcceptsButNeverAnswersDoesNotHangTheClient() async throws {
        // What a client saw when a .socket unit's listener had no daemon behind it: connect() succeeds (the
        // kernel queues it) and nothing ever answers. Before, `connect` waited forever.
        let own = try TemporaryFolder()
        let listener = try listenUnix(path: "\(own.path)/silent.sock").release()
        defer { close(listener) }
        let started = monotonicNanoseconds()
        do {
            _ = try await ExtensionHost.connect(socketPath: "\(own.path)/silent.sock", reconnectTimeout: 1)
            Issue.record("connected to a socket nobody serves")
        } catch {
            #expect(error.code == .daemonUnavailable)
            #expect(error.detail.contains("did not answer 'connect'"), "\(error)")
        }
        #expect(monotonicNanoseconds() - started < 30_000_000_000)
    }

    @Test func theUnitFilesMatchWhatTheDaemonDoes() throws {
        // No systemd here to load them; check that they ask for what the daemon implements.
        let service = try #require(readSmallFile("\(packageRoot)/config/sdk-host.service"))
        let socket = try #require(readSmallFile("\(packageRoot)/config/sdk-host.socket"))
        for line in ["Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "WatchdogSec=", "Requires=sdk-host.socket"] {
            #expect(service.contains("\n\(line)"), "sdk-host.service lacks \(line)")
        }
        #expect(service.contains("ExecStart=") && service.contains(" serve "))
        // One stream socket, where clients look by default ($XDG_RUNTIME_DIR/sdk-host/sdk-host.sock).
        #expect(socket.components(separatedBy: "\nListenStream=").count == 2)
        #expect(socket.contains("ListenStream=%t/sdk-host/sdk-host.sock"))
    }
}
