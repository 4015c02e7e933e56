// The host against extensions that attack it: floods of output with forged log lines, a reply for a request
// on another worker, a worker that stops itself, and plain print() that must not be lost. Each test checks the
// host keeps serving and every request ends exactly once.
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension FaultTests {
    @Suite(.serialized) struct HostileWorkers {
        @Test func anOutputFloodIsRateLimitedEscapedAndDoesNotStallTheHost() async throws {
            try await withHost({ $0.logLevel = .info }) { host, log in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                // 64 MiB of output, about 300,000 lines; the first slice put every byte into the log.
                let flood = ext.beginRequest(withInputItems: [ExtensionItem(title: "flood:64")], deadline: 60)
                #expect(try await bystanderEcho(host, "meanwhile") == .completed([ExtensionItem(title: "meanwhile")]))
                #expect(await recorder.wait(for: flood) == .completed([ExtensionItem(title: "flood:64")]))
                let lines = log.all.filter { $0.contains("com.example.crasher[") && $0.contains("stdout:") }
                #expect(lines.count < 2000, "\(lines.count) output lines logged")
                #expect(lines.count > 0)
                // Each forged line is prefixed with its source, and its control characters are escaped.
                #expect(lines.allSatisfy { !$0.contains("\u{1B}") && !$0.contains("\r") && !$0.contains("\n") })
                #expect(lines.contains { $0.contains("sdk-host: error: forged by the extension \\x1b[2J\\x0d") })
                #expect(log.contains("line(s) dropped"))
                // Every line: logged, or counted within about a second of its drop although the worker lives on and
                // prints nothing more (the count was given only at its next line or its end).
                let unit = Array("sdk-host: error: forged by the extension \u{1B}[2J\r\n".utf8).count + 200 + 1
                let expected = 64 * 2 * (((1 << 20) + unit - 1) / unit)  // as Crasher's flood: two lines a unit
                func accounted() -> (logged: Int, counted: Int) {
                    let stdout = log.all.filter { $0.contains("com.example.crasher[") && $0.contains("stdout: ") }
                    let counts = droppedCounts(in: stdout, marker: " line(s) dropped (more than")
                    return (stdout.count - counts.countLines, counts.total)
                }
                #expect(await eventually(timeout: 15) { accounted().logged + accounted().counted == expected },
                        "\(accounted()) logged and counted, of \(expected)")
                let pid = lines.first.flatMap { line in
                    line.firstRange(of: "com.example.crasher[").flatMap { start in
                        pid_t(line[start.upperBound...].prefix { $0.isNumber })
                    }
                }
                #expect(pid.map { kill($0, 0) == 0 } == true, "the worker (pid \(pid.map(String.init) ?? "?")) still runs")
            }
        }

        @Test func aReplyForAnotherWorkersRequestIsAProtocolViolation() async throws {
            let temp = TemporaryExtension(identifier: "com.example.single", executable: "Crasher", policy: """
                <key>MaxWorkers</key><integer>2</integer><key>MaxConcurrentRequests</key><integer>1</integer>
                """)
            defer { temp.remove() }
            try await withHost(extraSearchPaths: [temp.root]) { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.single")
                let victim = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:1500")])
                #expect(await eventually { ext.pid(for: victim) != nil })
                let forger = ext.beginRequest(withInputItems: [ExtensionItem(title: "forge:\(victim.uuidString)")])
                guard case .interrupted(.protocolViolation(let detail)) = await recorder.wait(for: forger) else {
                    Issue.record("the forger was not stopped")
                    return
                }
                #expect(detail.contains("reply for unknown request \(victim)"))
                #expect(await recorder.wait(for: victim) == .completed([ExtensionItem(title: "slow:1500")]),
                        "the forged reply did not end the victim's request")
                try await Task.sleep(nanoseconds: 200_000_000)
                #expect(recorder.callbacks(victim).count == 1)
            }
        }

        @Test func aStoppedWorkerIsKilledAfterTheHeartbeatTimeout() async throws {
            try await withHost({ $0.heartbeatInterval = .seconds(0.2); $0.heartbeatTimeout = .seconds(1) }) { host, log in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "stop")], deadline: 60)
                #expect(await recorder.wait(for: id) == .interrupted(.hang))
                #expect(log.contains("missed heartbeats"))
                // The line says what the silent worker was doing: here, stopped (state T), its first thread (named
                // after the executable) and every other; with the time each ran and waited for a CPU.
                let line = log.all.first { $0.contains("missed heartbeats") } ?? ""
                #expect(line.contains("byte(s) unread on its socket, 0 queued for it; threads: Crasher T "), "\(line)")
                #expect(line.contains(" ms, waited ") && !line.contains(" R "), "\(line)")
                let next = ext.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
                #expect(await recorder.wait(for: next) == .completed([ExtensionItem(title: "echo")]))
            }
        }

        @Test func printReachesTheLogLineByLine() async throws {
            try await withHost({ $0.logLevel = .info }) { host, log in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "print:hello from print()")])
                #expect(await recorder.wait(for: id) == .completed([ExtensionItem(title: "print:hello from print()")]))
                // The worker is still running: the line arrived because stdout is line-buffered, not at exit.
                #expect(await eventually(timeout: 10) { log.contains("stdout: hello from print()") })
            }
        }
    }
}
