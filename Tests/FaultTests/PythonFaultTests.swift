// The crash matrix against the Python echo (com.example.echo-python, on sdkhost.py), embedded: it dies of what
// kills it, honours a deadline's cancel, and serves on. Real processes, real signals, under the strict sandbox.
// The C Crasher's faults run with the Swift Crasher's (CrasherFaultTests); both through a daemon in DaemonTests.
import SDKWire
import HostTestSupport
import SDKHost
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension FaultTests {
    @Suite(.serialized) struct PythonEchoFaults {
        /// Killed from outside mid-request by each signal, the Python worker's request ends with that signal, and
        /// the next request gets a new worker.
        @Test(arguments: [SIGKILL, SIGSEGV, SIGABRT])
        func thePythonEchoDiesOfWhatKillsIt(_ signal: Int32) async throws {
            try await withHost { host, log in
                let (ext, recorder) = try recordedExtension(host, "com.example.echo-python")
                // A ready worker: killed before its handshake, its request would go to the next worker instead.
                let ready = try await ext.prewarm()
                let (id, assigned) = beginNotingPid(ext, "slow:10000")
                #expect(await eventually { assigned.pid > 0 })
                #expect(assigned.pid == ready)
                try await Task.sleep(nanoseconds: 100_000_000)
                kill(assigned.pid, signal)
                #expect(await recorder.wait(for: id) == .interrupted(.signal(signal)))
                let next = ext.beginRequest(withInputItems: [ExtensionItem(title: "again")])
                let nextOutcome = await recorder.wait(for: next)
                #expect(nextOutcome == .completed([ExtensionItem(title: "again")]),
                        "\(String(describing: nextOutcome)); log: \(log.all.suffix(8).joined(separator: " | "))")
                let (stats, crashes, _) = await host.inspect()
                #expect(crashes.count == 1 && crashes.first?.inFlightRequests == [id], "\(crashes)")
                #expect(stats.spawns == 2)
            }
        }

        /// A deadline cancels the Python worker's slow request; it honours the cancel and serves on (no kill).
        @Test func thePythonEchoHonoursADeadlinesCancel() async throws {
            try await withHost { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.echo-python")
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:10000")], deadline: 0.5)
                #expect(await recorder.wait(for: id) == .interrupted(.timedOut))
                let next = ext.beginRequest(withInputItems: [ExtensionItem(title: "after")])
                #expect(await recorder.wait(for: next) == .completed([ExtensionItem(title: "after")]))
                try await Task.sleep(nanoseconds: 2_500_000_000)  // past the cancel grace
                // Not killed for ignoring the cancel: no crash report (a second worker may have served "after"
                // while the first was still winding the cancelled request down).
                let (_, crashes, _) = await host.inspect()
                #expect(crashes.isEmpty, "\(crashes)")
            }
        }

        /// A worker that skips its `welcome` (and with it the version and identifier checks) and answers all the
        /// same broke the protocol (PROTOCOL.md, Lifecycle): its reply, or its pong, is refused, and its request
        /// ends so, not completed. Before, the host took both.
        @Test(.enabled(if: defaultPython != nil))
        func aWorkerThatAnswersBeforeItsWelcomeBreaksTheProtocol() async throws {
            let folder = try TemporaryFolder()
            writeRawPythonExtension(in: folder.path, name: "Rude", identifier: "com.example.rude", interpreter: defaultPython!,
                                    loop: #"""
                while True:
                    m = receive()
                    if m["type"] == "begin":
                        send({"type": "complete", "id": m["id"], "items": m["items"]})
                """#)
            writeRawPythonExtension(in: folder.path, name: "RudePong", identifier: "com.example.rude-pong", interpreter: defaultPython!,
                                    loop: #"""
                while True:
                    m = receive()
                    if m["type"] == "ping":
                        send({"type": "pong", "seq": m["seq"]})
                """#)
            let (host, _) = try makeHost(extraSearchPaths: [folder.path])
            for (identifier, type) in [("com.example.rude", "complete"), ("com.example.rude-pong", "pong")] {
                let ext = try host.extension(identifier: identifier)
                let recorder = Recorder()
                recorder.attach(to: ext)
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "hi")], deadline: 60)
                #expect(await recorder.wait(for: id, timeout: 30)
                        == .interrupted(.protocolViolation("worker sent '\(type)' before its 'welcome'")))
            }
            await host.shutdown()
        }

        /// A worker that sends 5,000 messages of a type no version knows (each logged and ignored) and then 5,000
        /// `error` messages costs the host's log a bounded number of lines and a count of the rest, and serves on.
        @Test(.enabled(if: defaultPython != nil))
        func aFloodOfMessagesDoesNotFloodTheLog() async throws {
            let folder = try TemporaryFolder()
            writeRawPythonExtension(in: folder.path, name: "Chatty", identifier: "com.example.chatty", interpreter: defaultPython!,
                                    loop: #"""
                while True:
                    m = receive()
                    if answered(m):
                        pass
                    elif m["type"] == "begin":
                        for i in range(5000): send({"type": "chatter", "n": i})
                        for i in range(5000): send({"type": "error", "message": "noise %d" % i})
                        send({"type": "complete", "id": m["id"], "items": m["items"]})
                """#)
            let (host, log) = try makeHost(extraSearchPaths: [folder.path])
            let ext = try host.extension(identifier: "com.example.chatty")
            #expect(try await ext.perform([ExtensionItem(title: "go")]) == [ExtensionItem(title: "go")])
            let about = log.all.filter { $0.contains("com.example.chatty") }
            let unknown = about.filter { $0.contains("unknown message type") }.count
            let errors = about.filter { $0.contains("reported an error") }.count
            #expect(unknown + errors <= Int(2 * 200), "\(unknown) + \(errors) lines")
            #expect(unknown > 0, "the first ones are logged")
            #expect(about.contains { $0.contains("more line(s) about its messages dropped") }, "the rest are counted")
            // Every one of them: logged, or counted within a second of its drop. The count was given only when a
            // drop came a second after the last count: a flood that stopped left the rest of it uncounted.
            func dropped() -> Int {
                droppedCounts(in: log.all.filter { $0.contains("com.example.chatty") },
                              marker: " more line(s) about its messages dropped").total
            }
            #expect(await eventually(timeout: 20) { unknown + errors + dropped() == 10_000 },
                    "\(unknown) + \(errors) logged, \(dropped()) counted as dropped, of 10,000")
            await host.shutdown()
        }

        /// Output lines dropped after a count are counted within a second, although the worker lives on and prints
        /// nothing more: the count was given only at a drop a second after the last count, or at the worker's end
        /// (30 s idle here). Two bursts 0.3 s apart on stdout and on stderr: the second's drops come just after a count.
        @Test(.enabled(if: defaultPython != nil))
        func outputDroppedAfterACountIsCountedWhileTheWorkerLives() async throws {
            let folder = try TemporaryFolder()
            writeRawPythonExtension(in: folder.path, name: "Bursty", identifier: "com.example.bursty", interpreter: defaultPython!,
                                    loop: #"""
                import time
                while True:
                    m = receive()
                    if answered(m):
                        pass
                    elif m["type"] == "begin":
                        for burst in range(2):
                            for stream in (sys.stdout, sys.stderr):
                                for i in range(300): stream.write("burst %d line %d\n" % (burst, i))
                                stream.flush()
                            time.sleep(0.3)
                        send({"type": "complete", "id": m["id"], "items": m["items"]})
                """#)
            let (host, log) = try makeHost(extraSearchPaths: [folder.path])
            let ext = try host.extension(identifier: "com.example.bursty")
            #expect(try await ext.perform([ExtensionItem(title: "go")]) == [ExtensionItem(title: "go")])
            func accounted(_ stream: String) -> (logged: Int, counted: Int) {
                let lines = log.all.filter { $0.contains("com.example.bursty[") && $0.contains("\(stream): ") }
                let counts = droppedCounts(in: lines, marker: " line(s) dropped (more than")
                return (lines.count - counts.countLines, counts.total)
            }
            for stream in ["stdout", "stderr"] {
                #expect(await eventually(timeout: 10) { accounted(stream).logged + accounted(stream).counted == 600 },
                        "\(stream): \(accounted(stream)) logged and counted, of 600")
                #expect(accounted(stream).counted > 0, "\(stream): some were dropped")
            }
            #expect(!log.all.contains { $0.contains("com.example.bursty") && $0.contains("exited") }, "the worker lives on")
            await host.shutdown()
        }
    }
}
