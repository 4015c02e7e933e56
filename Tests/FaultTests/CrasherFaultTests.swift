// Crash injection, one test per Crasher fault, for the Swift Crasher and the C one: each kills, hangs or corrupts a
// real worker process and checks the single outcome DESIGN.md's failure model gives it, the crash report, and that
// the next request is served.
import SDKWire
import HostTestSupport
import SDKHost
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Every fault test in one serialized suite: the leak checks count process-wide resources.
@Suite(.serialized) struct FaultTests {}

extension FaultTests {
    @Suite(.serialized) struct CrasherFaults {
        struct Case: CustomTestStringConvertible, Sendable {
            let fault: String
            let expected: @Sendable (RequestOutcome) -> Bool
            let crash: Bool
            var testDescription: String { fault }
        }

        static let cases: [Case] = [
            Case(fault: "segv", expected: { $0 == .interrupted(.signal(SIGSEGV)) }, crash: true),
            Case(fault: "abort", expected: { $0 == .interrupted(.signal(SIGABRT)) }, crash: true),
            // A Swift runtime trap is SIGILL (ud2) on x86-64 and SIGTRAP (brk) on arm64.
            Case(fault: "range", expected: { $0 == .interrupted(.signal(SIGILL)) || $0 == .interrupted(.signal(SIGTRAP)) }, crash: true),
            Case(fault: "exit", expected: { $0 == .interrupted(.exited(7)) }, crash: true),
            Case(fault: "kill", expected: { $0 == .interrupted(.signal(SIGKILL)) }, crash: true),
            Case(fault: "garbage", expected: {
                if case .interrupted(.protocolViolation(let d)) = $0 { return d.contains("badMagic") }
                return false
            }, crash: true),
            Case(fault: "oversize", expected: {
                if case .interrupted(.protocolViolation(let d)) = $0 { return d.contains("frameTooLarge") }
                return false
            }, crash: true),
            Case(fault: "truncate", expected: {
                if case .interrupted(.protocolViolation(let d)) = $0 { return d.contains("truncated frame") }
                return false
            }, crash: true),
            // A crash while it writes a frame: the signal, not the frame it cut short (it was `truncated frame`).
            Case(fault: "truncate-segv", expected: { $0 == .interrupted(.signal(SIGSEGV)) }, crash: true),
            // Half a frame, its socket shut, and it lives on: killed (2 s on) for the truncated frame.
            Case(fault: "truncate-linger", expected: {
                if case .interrupted(.protocolViolation(let d)) = $0 { return d.contains("truncated frame") }
                return false
            }, crash: true),
            Case(fault: "unknownid", expected: {
                if case .interrupted(.protocolViolation(let d)) = $0 { return d.contains("reply for unknown request") }
                return false
            }, crash: true),
            // The deadline ends the request at once (timedOut); the worker ignores the cancel and is killed after
            // the grace period, which is what the crash report records.
            Case(fault: "hang", expected: { $0 == .interrupted(.timedOut) }, crash: true),
            // The Swift Crasher's domain is com.example.crasher, the C one's com.example.crasher-c.
            Case(fault: "cancel", expected: {
                if case .cancelled(let e) = $0 { return e.domain.hasPrefix("com.example.crasher") && e.code == 42 }
                return false
            }, crash: false),
            Case(fault: "double", expected: { $0 == .completed([ExtensionItem(title: "first")]) }, crash: false),
            // A reply nested past 512 levels is not "too large" (it said so): cancelled, saying what it is.
            Case(fault: "deepreply", expected: {
                if case .cancelled(let e) = $0 { return e.domain == "SDKExtension" && e.code == 3 && e.message.hasPrefix("reply cannot be encoded") }
                return false
            }, crash: false),
            Case(fault: "slow:100", expected: { $0 == .completed([ExtensionItem(title: "slow:100")]) }, crash: false),
            Case(fault: "echo", expected: { $0 == .completed([ExtensionItem(title: "echo")]) }, crash: false),
        ]

        /// Each fault of the Swift Crasher, and of the C one (com.example.crasher-c, on the C runtime), which must
        /// have the same outcome.
        @Test(arguments: cases, ["com.example.crasher", "com.example.crasher-c"])
        func faultHasItsOutcome(_ c: Case, _ crasher: String) async throws {
            try await withHost { host, log in
                let (ext, recorder) = try recordedExtension(host, crasher)
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: c.fault)], deadline: 2)
                let outcome = await recorder.wait(for: id)
                #expect(outcome.map(c.expected) == true,
                        "\(c.fault): \(String(describing: outcome)); log: \(log.all.suffix(8).joined(separator: " | "))")

                // The host is still serving: a new request on the same extension completes.
                let next = ext.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
                #expect(await recorder.wait(for: next) == .completed([ExtensionItem(title: "echo")]))

                // Exactly one callback each, even after stragglers had time to arrive.
                try await Task.sleep(nanoseconds: 200_000_000)
                #expect(recorder.callbacks(id).count == 1)
                #expect(recorder.callbacks(next).count == 1)

                if c.fault == "hang" {
                    #expect(await eventually { await host.inspect().1.count == 1 }, "killed after ignoring the cancel")
                    // Its log line does not call the request it had (ended at its deadline) interrupted.
                    #expect(log.contains("0 request(s) interrupted (1 more on it had ended already or went back to the queue)"),
                            "\(log.all.suffix(8).joined(separator: " | "))")
                }
                let (stats, crashes, _) = await host.inspect()
                // A protocol violation is counted once; any other outcome counts none (a crash mid-frame included).
                if case .interrupted(.protocolViolation)? = outcome {
                    #expect(stats.protocolViolations == 1, "\(c.fault): counted \(stats.protocolViolations) times")
                } else {
                    #expect(stats.protocolViolations == 0, "\(c.fault): counted \(stats.protocolViolations) times")
                }
                if c.crash {
                    #expect(crashes.count == 1)
                    #expect(crashes.first?.inFlightRequests == [id])
                    if c.fault == "hang" { #expect(crashes.first?.reason == .hang) }
                    #expect(stats.spawns == 2, "the crashed worker is replaced on the next request")
                } else {
                    #expect(crashes.isEmpty)
                    #expect(stats.spawns == 1)
                }
                if c.fault == "double" {
                    #expect(log.contains("second reply for \(id)"), "the duplicate completion is dropped and logged")
                }
            }
        }

        @Test func crashReportCarriesStderrTail() async throws {
            try await withHost { host, log in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "stderr")])
                #expect(await recorder.wait(for: id) == .interrupted(.signal(SIGABRT)))
                let (_, crashes, _) = await host.inspect()
                #expect(crashes.first?.stderrTail.contains("crasher: about to abort on request") == true)
                #expect(crashes.first?.extensionIdentifier == "com.example.crasher")
                #expect(log.contains("crasher: about to abort on request"), "the extension's output reaches the host log")
            }
        }
    }
}
