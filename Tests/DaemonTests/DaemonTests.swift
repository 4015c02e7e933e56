// Daemon mode end to end: a real `sdk-host serve`, real client processes, real crashes and kills.
import SDKWire
import HostTestSupport
@testable import SDKDaemon
import SDKHost
import SDKPosix
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct DaemonTests {
    @Test func requestsStatusAndCrashReportsThroughTheDaemon() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        #expect(host.extensionIdentifiers == ["com.example.async-echo", "com.example.crasher", "com.example.crasher-c", "com.example.echo",
                                              "com.example.echo-python", "com.example.escaper", "com.example.renderer", "com.example.ticker"])
        #expect(throws: HostError.self) { _ = try host.extension(identifier: "com.example.nope") }
        let echo = try host.extension(identifier: "com.example.echo")
        #expect(try await echo.perform([ExtensionItem(title: "via daemon", userInfo: ["n": 1])])
            == [ExtensionItem(title: "via daemon", userInfo: ["n": 1])])
        let crasher = try host.extension(identifier: "com.example.crasher")
        await #expect(throws: RequestFailure.interrupted(.signal(SIGSEGV))) {
            try await crasher.perform([ExtensionItem(title: "segv")])
        }
        // A deadline ends the request at once; a worker that honours the cancel lives on...
        await #expect(throws: RequestFailure.interrupted(.timedOut)) {
            try await crasher.perform([ExtensionItem(title: "slow:5000")], deadline: 0.3)
        }
        // ...and one that ignores it is killed after CancelGraceSeconds, recorded as a hang.
        await #expect(throws: RequestFailure.interrupted(.timedOut)) {
            try await crasher.perform([ExtensionItem(title: "hang")], deadline: 0.3)
        }
        // Deadlines past what milliseconds in an Int64 hold are clamped, as an embedded host's are (converting
        // `.seconds(Int64.max)` to the wire's milliseconds trapped: the app died of SIGILL).
        #expect(try await echo.perform([ExtensionItem(title: "far")], deadline: .seconds(Int64.max)) == [ExtensionItem(title: "far")])
        await #expect(throws: RequestFailure.interrupted(.timedOut)) {
            try await echo.perform([ExtensionItem(title: "past")], deadline: .seconds(Int64.min))
        }
        // pid(for:) reports the daemon's worker.
        let recorder = Recorder()
        recorder.attach(to: crasher)
        let slow = crasher.beginRequest(withInputItems: [ExtensionItem(title: "slow:400")])
        #expect(await eventually { crasher.pid(for: slow) != nil })
        let workerPid = try #require(crasher.pid(for: slow))
        #expect(readLink("/proc/\(workerPid)/exe")?.hasSuffix("/Crasher") == true)
        #expect(await recorder.wait(for: slow) == .completed([ExtensionItem(title: "slow:400")]))

        #expect(await eventually { CrashReportStore.load(directory: daemon.crashFolder).count == 2 })
        let report = try #require(await host.daemonStatus())
        #expect(report["pid"]?.integerValue == Int64(daemon.pid))
        let crasherStats = report["extensions"]?.arrayValue?.first { $0["identifier"] == "com.example.crasher" }
        #expect(crasherStats?["crashes"]?.integerValue == 2)
        #expect(crasherStats?["completions"]?.integerValue == 1)
        #expect(crasherStats?["hangKills"]?.integerValue == 1)
        #expect(crasherStats?["timeouts"]?.integerValue == 2)
        // Each worker's sandbox layers, as its launcher reported them.
        let layers = (crasherStats?["workers"]?.arrayValue?.first?["sandbox"]?.arrayValue ?? []).compactMap(\.stringValue)
        #expect(layers.contains("seccomp") && layers.contains("noNewPrivs") && layers.contains { $0.hasPrefix("landlock:") },
                "\(layers)")
        let reasons = CrashReportStore.load(directory: daemon.crashFolder).map(\.reason)
        #expect(reasons == [.signal(SIGSEGV), .hang])
        await host.shutdown()
        #expect(await daemon.stop() == 0)
        #expect(access(daemon.socket, F_OK) != 0, "the socket is removed on exit")
    }

    /// The crash matrix through a daemon for the workers in other languages: the C Crasher's faults have the Swift
    /// Crasher's outcomes (four crashes and a hang: the daemon's restart limit is five; FaultTests runs every
    /// fault embedded), and the Python echo serves, honours a deadline and dies of what kills it.
    @Test func otherLanguagesFaultsThroughTheDaemon() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        let crasher = try host.extension(identifier: "com.example.crasher-c")
        func outcome(_ ext: Extension, _ title: String, deadline: Double? = nil) async -> RequestOutcome {
            await ext.start([ExtensionItem(title: title)], deadline: deadline.map { .seconds($0) }).outcome
        }
        let cases: [(String, @Sendable (RequestOutcome) -> Bool)] = [
            ("echo", { $0 == .completed([ExtensionItem(title: "echo")]) }),
            ("segv", { $0 == .interrupted(.signal(SIGSEGV)) }),
            ("range", { $0 == .interrupted(.signal(SIGILL)) || $0 == .interrupted(.signal(SIGTRAP)) }),
            ("exit", { $0 == .interrupted(.exited(7)) }),
            ("garbage", { if case .interrupted(.protocolViolation(let d)) = $0 { d.contains("badMagic") } else { false } }),
            ("cancel", { if case .cancelled(let e) = $0 { e.domain == "com.example.crasher-c" && e.code == 42 } else { false } }),
            ("double", { $0 == .completed([ExtensionItem(title: "first")]) }),
        ]
        for (fault, expected) in cases {
            let got = await outcome(crasher, fault)
            #expect(expected(got), "\(fault): \(got)")
        }
        #expect(await outcome(crasher, "hang", deadline: 0.3) == .interrupted(.timedOut))

        let python = try host.extension(identifier: "com.example.echo-python")
        #expect(try await python.perform([ExtensionItem(title: "via daemon", userInfo: ["n": 1])])
            == [ExtensionItem(title: "via daemon", userInfo: ["n": 1])])
        // Killed mid-request: the worker is ready (the echo above), so the kill is not one before its handshake,
        // after which the host would send the request again to the next worker.
        let slow = python.start([ExtensionItem(title: "slow:10000")])
        #expect(await eventually { slow.pid != nil })
        kill(try #require(slow.pid), SIGKILL)
        let killed = await slow.outcome
        #expect(killed == .interrupted(.signal(SIGKILL)), "\(killed)")
        #expect(try await python.perform([ExtensionItem(title: "again")]) == [ExtensionItem(title: "again")])
        #expect(await outcome(python, "slow:10000", deadline: 0.3) == .interrupted(.timedOut))
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func twoClientProcessesWithFaultsDoNotAffectEachOther() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let outA = "\(daemon.folder)/a.json", outB = "\(daemon.folder)/b.json"
        let a = spawnProgram([sdkHostBinary, "hammer", "--socket", daemon.socket, "--count", "2000", "--faults", "25"], stdout: outA)
        let b = spawnProgram([sdkHostBinary, "hammer", "--socket", daemon.socket, "--count", "2000"], stdout: outB)
        #expect(await waitExit(a, timeout: 300) == 0)
        #expect(await waitExit(b, timeout: 300) == 0)
        let resultA = try HammerResult.fields(String(decoding: try readFile(outA), as: UTF8.self))
        let resultB = try HammerResult.fields(String(decoding: try readFile(outB), as: UTF8.self))
        #expect(resultA["completed"] == 2000 && resultA["interrupted"] == 25, "faulting client: \(resultA)")
        #expect(resultB["completed"] == 2000 && resultB["interrupted"] == 0, "clean client: \(resultB)")
        for r in [resultA, resultB] {
            #expect(r["duplicates"] == 0 && r["missing"] == 0 && r["wrongEcho"] == 0 && r["cancelled"] == 0)
        }
        #expect(await daemon.stop() == 0)
    }

    @Test func daemonKilledInterruptsInFlightThenClientReconnects() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        let (crasher, recorder) = try recordedExtension(host, "com.example.crasher")
        let ids = (0..<3).map { _ in crasher.beginRequest(withInputItems: [ExtensionItem(title: "slow:20000")], deadline: 60) }
        #expect(await eventually { ids.allSatisfy { crasher.pid(for: $0) != nil } })
        let workerPids = ids.compactMap { crasher.pid(for: $0) }
        daemon.signal(SIGKILL)
        #expect(await waitExit(daemon.pid) == 128 + SIGKILL)
        let outcomes = await recorder.wait(for: ids)
        #expect(ids.allSatisfy { outcomes?[$0] == .interrupted(.disconnected) })
        // The daemon's workers die with it (parent-death signal), leaving no orphans.
        #expect(await eventually { workerPids.allSatisfy { !processIsAlive($0) } })
        // Restart on the same socket (the stale file is replaced); the next request reconnects by itself.
        try await daemon.start()
        let again = crasher.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
        #expect(await recorder.wait(for: again) == .completed([ExtensionItem(title: "echo")]))
        try await Task.sleep(nanoseconds: 200_000_000)
        #expect((ids + [again]).allSatisfy { recorder.callbacks($0).count == 1 })
        #expect(daemon.logText.contains("removing stale socket"))
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }

    /// A daemon that stops answering (SIGSTOP here; a wedged loop alike) cannot hold the app. Before, everything
    /// below waited for the daemon, for ever (an outside tester's finding):
    /// - a cancel ends the request at once, as an embedded host's does; the `cancelled` the daemon sends once it
    ///   runs again is dropped without a word;
    /// - `status()` returns nil after `reconnectTimeout` (or at once when its Task is cancelled);
    /// - a request past its deadline ends `timedOut` (the client's own backstop, a second after the deadline);
    /// - a request without a deadline ends `disconnected` once a ping has gone unanswered for `heartbeatTimeout`.
    @Test func aStoppedDaemonCannotHoldADeadlineACancelOrStatus() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let clientLog = Mutex<[String]>([])
        let host = try await ExtensionHost.connect(socketPath: daemon.socket, reconnectTimeout: 1, heartbeatTimeout: 2,
                                                   logHandler: { _, line in clientLog.withLock { $0.append(line) } })
        let (echo, recorder) = try recordedExtension(host, "com.example.echo")
        #expect(try await echo.perform([ExtensionItem(title: "warm")]) == [ExtensionItem(title: "warm")])
        /// The daemon's scheduler state ("T" while stopped).
        func state() -> Substring? {
            guard let stat = readSmallFile("/proc/\(daemon.pid)/stat"), let close = stat.lastIndex(of: ")") else { return nil }
            return stat[stat.index(close, offsetBy: 2)...].prefix(1)
        }
        /// `status()` from a Task (cancelled at once with `cancelling`): whether it returned within 20 s, and what.
        /// Bounded, so that a client that waits for ever fails this test rather than hanging the suite.
        func status(cancelling: Bool = false) async -> (returned: Bool, status: HostStatus?) {
            let answer = Mutex<(Bool, HostStatus?)>((false, nil))
            let asking = Task {
                let status = await host.status()
                answer.withLock { $0 = (true, status) }
            }
            if cancelling { asking.cancel() }
            _ = await eventually(timeout: 20) { answer.withLock { $0.0 } }
            return answer.withLock { $0 }
        }

        // A cancel while it is stopped; it runs again before the client gives the connection up, and its own
        // `cancelled` for that request comes on the same connection: dropped, not reported as unknown.
        daemon.signal(SIGSTOP)
        #expect(await eventually { state() == "T" })
        let first = echo.beginRequest(withInputItems: [ExtensionItem(title: "first")])
        echo.cancelRequest(first)
        #expect(await recorder.wait(for: first, timeout: 20) == .cancelled(.cancelledByHost))
        #expect(state() == "T", "the daemon ran meanwhile: the outcome may have been its own")
        daemon.signal(SIGCONT)
        #expect(try await echo.perform([ExtensionItem(title: "between")]) == [ExtensionItem(title: "between")])
        #expect(!clientLog.withLock { $0 }.contains { $0.contains("unknown or finished request") }, "\(clientLog.withLock { $0 })")

        // Stopped for longer than the heartbeat.
        daemon.signal(SIGSTOP)
        #expect(await eventually { state() == "T" })
        let timed = echo.beginRequest(withInputItems: [ExtensionItem(title: "timed")], deadline: .milliseconds(300))
        let open = echo.beginRequest(withInputItems: [ExtensionItem(title: "no deadline")])
        // status() gives up after reconnectTimeout (1 s), while the connection is still held (the heartbeat gives
        // it up 2 s after a ping, and that would answer it nil too): `open` has not ended yet.
        let (returned, report) = await status()
        #expect(returned && report == nil && recorder.callbacks(open).isEmpty)
        let (returnedCancelled, reportCancelled) = await status(cancelling: true)
        #expect(returnedCancelled && reportCancelled == nil)
        #expect(await recorder.wait(for: timed, timeout: 20) == .interrupted(.timedOut))
        #expect(await recorder.wait(for: open, timeout: 20) == .interrupted(.disconnected))
        #expect(state() == "T", "the daemon ran meanwhile: the outcomes may have been its own")
        daemon.signal(SIGCONT)
        // It serves again (the client connects again).
        #expect(try await echo.perform([ExtensionItem(title: "after")]) == [ExtensionItem(title: "after")])
        #expect(await status().status != nil)
        try await Task.sleep(nanoseconds: 200_000_000)
        #expect([first, timed, open].allSatisfy { recorder.callbacks($0).count == 1 })
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }

    /// `status()` and a prewarm asked while the host shuts down get their answer (nil, a failure): a stopping
    /// loop still ran them, after the shutdown had answered every waiter, and they waited for ever (a reviewer's
    /// finding).
    /// An app drops its host (no shutdown awaited) while the client retries its connection to a daemon that has
    /// gone. The retry timer held the client unowned and was not cancelled at shutdown: fired in the loop's last
    /// turn, after the shutdown task had let the client go, it aborted the app ("Attempted to read an unowned
    /// reference"). Found from outside. A handler that blocks the loop (against `callsHandlersOnHostLoop`'s
    /// contract, here only to hold the timing) makes a retry fall due while the host is dropped.
    @Test func aClientDroppedWhileItRetriesItsConnectionEndsCleanly() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let outcomes = Mutex<[String]>([])
        let blocking = Atomic<Bool>(false)
        do {
            let host = try await ExtensionHost.connect(socketPath: daemon.socket, reconnectTimeout: 30)
            let echo = try host.extension(identifier: "com.example.echo")
            #expect(try await echo.perform([ExtensionItem(title: "warm")]) == [ExtensionItem(title: "warm")])
            #expect(await daemon.stop() != nil, "the daemon did not stop")
            echo.callsHandlersOnHostLoop = true
            echo.requestCompletionHandler = { _, _ in outcomes.withLock { $0.append("completed") } }
            echo.requestCancellationHandler = { _, _ in outcomes.withLock { $0.append("cancelled") } }
            echo.requestInterruptionHandler = { _, reason in
                outcomes.withLock { $0.append("\(reason)") }
                blocking.store(true, ordering: .relaxed)
                usleep(1_500_000)
            }
            echo.beginRequest(withInputItems: [ExtensionItem(title: "queued")], deadline: .milliseconds(300))
            #expect(await eventually(timeout: 20) { blocking.load(ordering: .relaxed) }, "the request never ended")
        }
        // The host and its extension are dropped here, while the loop is held in the handler: retries fall due.
        try await Task.sleep(nanoseconds: 3_000_000_000)
        #expect(outcomes.withLock { $0 }.count == 1, "\(outcomes.withLock { $0 })")
    }

    @Test func statusDuringShutdownReturns() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        for _ in 0..<20 {
            let host = try await ExtensionHost.connect(socketPath: daemon.socket, reconnectTimeout: 1)
            let answered = Mutex(false)
            let asking = Task {
                _ = await host.status()
                answered.withLock { $0 = true }
            }
            host.shutdown {}
            #expect(await eventually(timeout: 20) { answered.withLock { $0 } })
            asking.cancel()
        }
        #expect(await daemon.stop() == 0)
    }

    @Test func requestWithNoDaemonIsInterruptedNotStuck() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let host = try await ExtensionHost.connect(socketPath: daemon.socket, reconnectTimeout: 1)
        let echo = try host.extension(identifier: "com.example.echo")
        #expect(await daemon.stop() == 0)
        let recorder = Recorder()
        recorder.attach(to: echo)
        let id = echo.beginRequest(withInputItems: [ExtensionItem(title: "x")])
        #expect(await recorder.wait(for: id, timeout: 20) == .interrupted(.disconnected))
        await host.shutdown()
    }

    @Test func theClientRefusesADaemonItCannotTrust() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        func refusal(daemonUID: uid_t? = nil) async -> String? {
            do {
                let host = try await ExtensionHost.connect(socketPath: daemon.socket, reconnectTimeout: 1, daemonUID: daemonUID)
                await host.shutdown()
                return nil
            } catch {
                #expect(error.code == .daemonUnavailable)
                return error.detail
            }
        }
        // A daemon running as a uid other than the one asked for (SO_PEERCRED on the connected socket).
        let wrongUID = await refusal(daemonUID: 54321)
        #expect(wrongUID?.contains("served by uid \(getuid())") == true && wrongUID?.contains("not by uid 54321") == true,
                "\(String(describing: wrongUID))")
        // A folder others may write to: anyone could have put their own socket there.
        chmod(daemon.folder, 0o777)
        let writable = await refusal()
        #expect(writable?.contains("writable by others") == true, "\(String(describing: writable))")
        chmod(daemon.folder, 0o700)
        // A folder that belongs to another user (only root can hand one over; skipped otherwise).
        if getuid() == 0 {
            chown(daemon.folder, 65534, 65534)
            let foreign = await refusal()
            #expect(foreign?.contains("belongs to uid 65534") == true, "\(String(describing: foreign))")
            chown(daemon.folder, 0, 0)
        }
        // And the same daemon, trusted again, serves.
        #expect(await refusal() == nil)
        #expect(await daemon.stop() == 0)
    }

    @Test func uidNotAllowedIsRefusedBySOPeerCred() async throws {
        // Our own uid is not on the list: the daemon checks the kernel's peer credentials and refuses us.
        let daemon = try await DaemonProcess(extraConfig: "<key>AllowedUIDs</key><array><integer>54321</integer></array>")
        defer { daemon.remove() }
        do {
            _ = try await ExtensionHost.connect(socketPath: daemon.socket)
            Issue.record("a client whose uid is not allowed was accepted")
        } catch {
            #expect(error.code == .daemonUnavailable)
            #expect(error.detail.contains("uid \(getuid())") && error.detail.contains("not allowed"), "\(error)")
        }
        #expect(await eventually { daemon.logText.contains("refused uid \(getuid())") })
        #expect(await daemon.stop() == 0)
    }

    @Test(.enabled(if: getuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0, "needs root and setpriv"))
    func anotherUserIsRefusedAndTheAllowedOneServed() async throws {
        // A world-reachable socket so that uid 65534 can connect at all; only SO_PEERCRED keeps it out.
        let daemon = try await DaemonProcess(socketMode: 0o666, folderMode: 0o755)
        defer { daemon.remove() }
        let err = "\(daemon.folder)/nobody.err"
        let nobody = spawnProgram(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                   sdkHostBinary, "request", "com.example.echo", "--socket", daemon.socket], stderr: err)
        #expect(await waitExit(nobody) == 1)  // a runtime failure (the daemon refused), not a usage error
        let message = String(decoding: try readFile(err), as: UTF8.self)
        #expect(message.contains("uid 65534") && message.contains("not allowed"), "\(message)")
        let root = spawnProgram([sdkHostBinary, "request", "com.example.echo", "--socket", daemon.socket, "--text", "hi"])
        #expect(await waitExit(root) == 0)
        #expect(await daemon.stop() == 0)
    }

    /// An extension that cannot start is refused by name through the daemon; the reason (which names the operator's
    /// files) goes to the daemon's own uid and root, and another allowed uid is told only that it cannot start.
    @Test(.enabled(if: getuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0, "needs root and setpriv"))
    func anotherUserIsToldAnExtensionCannotStartButNotWhy() async throws {
        let refused = TemporaryExtension(identifier: "com.example.refused", executable: "Echo",
                                         policy: "<key>MaxWorkers</key><integer>0</integer>")
        defer { refused.remove() }
        let daemon = try await DaemonProcess(extraConfig: "<key>AllowedUIDs</key><array><integer>0</integer><integer>65534</integer></array>",
                                             socketMode: 0o666, folderMode: 0o755, extraSearchPaths: [refused.root])
        defer { daemon.remove() }
        let err = "\(daemon.folder)/nobody.err"
        let nobody = spawnProgram(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                   sdkHostBinary, "request", "com.example.refused", "--socket", daemon.socket], stderr: err)
        #expect(await waitExit(nobody) == 2)
        let told = String(decoding: try readFile(err), as: UTF8.self)
        #expect(told.contains("com.example.refused: no request can start") && !told.contains(refused.root), "\(told)")
        let rootErr = "\(daemon.folder)/root.err"
        let root = spawnProgram([sdkHostBinary, "request", "com.example.refused", "--socket", daemon.socket], stderr: rootErr)
        #expect(await waitExit(root) == 2)
        let rootTold = String(decoding: try readFile(rootErr), as: UTF8.self)
        #expect(rootTold.contains("\(refused.root)/Ext/Info.plist") && rootTold.contains("MaxWorkers: 0 is outside"), "\(rootTold)")
        #expect(await daemon.stop() == 0)
    }

    @Test func malformedClientFramesDropOnlyThatClient() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        let (crasher, recorder) = try recordedExtension(host, "com.example.crasher")
        let good = crasher.beginRequest(withInputItems: [ExtensionItem(title: "slow:800")])
        for junk in [[0, 0, 0, 5] + Array("hello".utf8), [0x7F, 0xFF, 0xFF, 0xFF], Array(try Frame.encode(["type": 7]))] as [[UInt8]] {
            let raw = try HostileClient(daemon.socket)
            raw.write(junk)
            // The daemon hangs up on this client: a read sees EOF (or a reset).
            #expect(raw.isClosedByDaemon(timeout: 10))
        }
        #expect(await recorder.wait(for: good) == .completed([ExtensionItem(title: "slow:800")]), "the good client is unaffected")
        #expect(daemon.logText.contains("sent bad input"))
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func sigtermDrainsInFlightThenInterruptsTheRest() async throws {
        let daemon = try await DaemonProcess(extraConfig: "<key>DrainTimeoutSeconds</key><real>1</real>")
        defer { daemon.remove() }
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        let (crasher, recorder) = try recordedExtension(host, "com.example.crasher")
        let quick = crasher.beginRequest(withInputItems: [ExtensionItem(title: "slow:300")])
        let long = crasher.beginRequest(withInputItems: [ExtensionItem(title: "slow:30000")], deadline: 60)
        #expect(await eventually { crasher.pid(for: quick) != nil && crasher.pid(for: long) != nil })
        daemon.signal(SIGTERM)
        #expect(await recorder.wait(for: quick) == .completed([ExtensionItem(title: "slow:300")]), "drained")
        #expect(await recorder.wait(for: long) == .interrupted(.hostShutdown), "interrupted after the drain timeout")
        #expect(await waitExit(daemon.pid) == 0)
        #expect(access(daemon.socket, F_OK) != 0)
        await host.shutdown()
    }

    @Test func daemonDescriptorsAndChildrenStayFlatOver10kRequests100CrashesAndClientChurn() async throws {
        let daemon = try await DaemonProcess(extraConfig: "<key>LogLevel</key><string>error</string>")
        defer { daemon.remove() }
        // Warm up: both extensions have their workers.
        let warm = spawnProgram([sdkHostBinary, "hammer", "--socket", daemon.socket, "--count", "200", "--faults", "1"], stdout: "/dev/null")
        #expect(await waitExit(warm) == 0)
        try await Task.sleep(nanoseconds: 300_000_000)
        let before = daemon.resources
        let out = "\(daemon.folder)/soak.json"
        let soak = spawnProgram([sdkHostBinary, "hammer", "--socket", daemon.socket, "--count", "10000", "--faults", "100"], stdout: out)
        #expect(await waitExit(soak, timeout: 600) == 0)
        let result = try HammerResult.fields(String(decoding: try readFile(out), as: UTF8.self))
        #expect(result["completed"] == 10000 && result["interrupted"] == 100 && result["duplicates"] == 0, "\(result)")
        // Client churn: sixty short-lived client processes, each connecting, requesting and leaving.
        for i in 0..<60 {
            let pid = spawnProgram([sdkHostBinary, "request", i % 10 == 9 ? "com.example.crasher" : "com.example.echo",
                                    "--socket", daemon.socket, "--text", i % 10 == 9 ? "abort" : "hi"], stdout: "/dev/null")
            #expect(await waitExit(pid) == (i % 10 == 9 ? 4 : 0))
        }
        // Crashed workers are replaced only on demand; let the last ones be reaped.
        let settled = await eventually(timeout: 20) {
            let now = daemon.resources
            return now.descriptors <= before.descriptors && now.children <= before.children
        }
        #expect(settled, "before \(before), after \(daemon.resources)")
        #expect(await daemon.stop() == 0)
    }

    @Test func configErrorsNameTheKeyAndTheFile() async throws {
        var template = "/tmp/sdkhost-config-XXXXXX".utf8CString
        let folder = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        defer { removeFolder(folder) }
        let cases: [(String, String)] = [
            ("<key>SocketPth</key><string>x</string>", "SocketPth: unknown key"),
            ("<key>LogLevel</key><integer>3</integer>", "LogLevel: expected a string, found integer"),
            ("<key>LogLevel</key><string>loud</string>", "LogLevel: 'loud' is not one of debug, info, warning, error"),
            ("<key>AllowedUIDs</key><array><string>root</string></array>", "AllowedUIDs[0]: expected a uid"),
            ("<key>DefaultPolicy</key><dict><key>MaxWorkers</key><real>2.5</real></dict>", "DefaultPolicy.MaxWorkers: expected an integer"),
            ("<key>DrainTimeoutSeconds</key><string>soon</string>", "DrainTimeoutSeconds: expected a number"),
            ("<key>BusyPollMicroseconds</key><integer>5000</integer>", "BusyPollMicroseconds: 5000 is outside 0...1000"),
            ("<key>AllowedSandboxModes</key><array><string>lax</string></array>", "AllowedSandboxModes: 'lax' is not one of strict, bestEffort, none"),
            ("<key>MaxMemoryLimitMB</key><integer>1</integer>", "MaxMemoryLimitMB: 1 is outside 16...65536"),
            ("<key>AllowedReadableRoots</key><array><string>data</string></array>", "AllowedReadableRoots: 'data' is not an absolute path"),
            ("<key>AllowNetwork</key><string>no</string>", "AllowNetwork: expected a boolean"),
            // The whole file system in every worker's root was skipped at each launch, with a warning per worker.
            ("<key>RuntimePaths</key><array><string>/usr/lib</string><string>/</string></array>",
             "RuntimePaths: '/' is the whole file system; name the folders every worker needs"),
            ("<key>Interpreters</key><dict><key>/usr/bin/python3</key><array><string>/usr/../</string></array></dict>",
             "is not an absolute path without '..'"),
            ("<key>Interpreters</key><dict><key>/usr/bin/python3</key><array><string>//.</string></array></dict>",
             "Interpreters./usr/bin/python3: '//.' is the whole file system; name the folders the interpreter needs"),
            ("<key>AllowedUIDs</key><array><integer>-1</integer></array>", "AllowedUIDs[0]: -1 is"),
            ("<key>DefaultPolicy</key><dict><key>ExecutableSHA256</key><string>00</string></dict>",
             "DefaultPolicy.ExecutableSHA256: is one executable's digest"),
            // A socket path no Unix socket can have was taken, and `serve` then failed on it.
            ("<key>SocketPath</key><string></string>", "SocketPath: '' names no socket file"),
            ("<key>SocketPath</key><string>/tmp/\(String(repeating: "s", count: 120))</string>",
             "a Unix socket's path holds at most 107"),
        ]
        for (n, (body, expected)) in cases.enumerated() {
            let path = "\(folder)/bad\(n).plist"
            writeFile(path, "<plist version=\"1.0\"><dict>\(body)</dict></plist>")
            let err = "\(folder)/bad\(n).err"
            let pid = spawnProgram([sdkHostBinary, "serve", "--config", path], stderr: err)
            #expect(await waitExit(pid) == 2, "\(expected)")
            let message = String(decoding: try readFile(err), as: UTF8.self)
            #expect(message.contains(path) && message.contains(expected), "\(message)")
            #expect(message.split(separator: "\n").count == 1, "one line: \(message)")
        }
    }

    @Test func shippedConfigLoadsWithDefaults() throws {
        let c = try DaemonConfiguration(contentsOf: "\(packageRoot)/config/sdk-host.plist", defaultExtensionSearchPaths: [])
        #expect(c.host.extensionSearchPaths == ["\(packageRoot)/config/../Extensions"])
        #expect(c.socketMode == 0o600)
        #expect(c.allowedUIDs == [getuid()])
        #expect(c.host.logLevel == .info)
        #expect(c.socketPath.hasSuffix("/sdk-host.sock"))
        #expect(c.host.allowedSandboxModes == [.strict, .bestEffort], "Sandbox none only where the operator allows it")
        #expect(c.host.maxMemoryLimitMB == nil && c.host.allowedReadableRoots == nil && c.host.allowNetwork)
    }
}

/// Reads the hammer's one-line JSON of integer fields.
enum HammerResult {
    static func fields(_ text: String) throws -> [String: Int] {
        var out: [String: Int] = [:]
        for pair in text.trimmingCharacters(in: "{}\n ").split(separator: ",") {
            let kv = pair.split(separator: ":")
            guard kv.count == 2, let v = Int(kv[1]) else { continue }
            out[String(kv[0].trimmingCharacters(in: "\" "))] = v
        }
        guard !out.isEmpty else { throw SystemError("parse", errno: EINVAL, detail: text) }
        return out
    }
}

extension StringProtocol {
    func trimmingCharacters(in set: String) -> String {
        let chars = Set(set)
        var s = Substring(self)
        while let f = s.first, chars.contains(f) { s.removeFirst() }
        while let l = s.last, chars.contains(l) { s.removeLast() }
        return String(s)
    }
}
