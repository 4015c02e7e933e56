// HostStatus, the one status model: its plist form and its JSON form both read back unchanged (report times
// included), and a status from a daemon that predates a field, or holds a report that does not read, still reads.
import Foundation
import Testing
import SDKWire
@testable import SDKHost

@Suite struct HostStatusTests {
    static func sample() -> HostStatus {
        let worker = WorkerStatus(pid: 42, app: "0/a", uptimeSeconds: 1.5, inFlight: 1, requestsServed: 3, recycling: false,
                                  sandbox: ["seccomp"], sandboxSkipped: [], sandboxMicroseconds: ["root": 300])
        let ext = ExtensionStatus(
            identifier: "x", state: .probation, crashCount: 1, retryInSeconds: nil, requests: 4, completions: 3,
            cancellations: 0, interruptions: 1, interruptionsByReason: ["signal": 1], latencyP50Milliseconds: 0.5,
            latencyP99Milliseconds: nil, slowRequests: 0, slowRequestsPer1000: 0, slowRequestSeconds: 0, crashes: 1,
            hangKills: 0, timeouts: 0, overloads: 0, protocolViolations: 0, spawns: 2, recycles: 0, quarantines: 1,
            leaks: 0, pools: [PoolStatus(app: nil, state: .probation, crashCount: 1, retryInSeconds: nil, backoffSeconds: 10)],
            workers: [worker])
        var crash = CrashReport(extensionIdentifier: "x", pid: 41, reason: .signal(11), time: 1_795_000_000.25,
                                inFlightRequests: [RequestID()], stderrTail: "Fatal error: boom\n")
        crash.app = "0/a"
        let leak = LeakReport(extensionIdentifier: "x", pid: 42, requestID: RequestID(), alive: ["task"],
                              afterMilliseconds: 5000, time: 1_795_000_100.5)
        return HostStatus(pid: 7, uptimeSeconds: 99.5, activeRequests: 1, queuedRequests: 0,
                          totals: StatusTotals(adding: [ext]), extensions: [ext], recentCrashes: [crash], recentLeaks: [leak])
    }

    @Test func thePlistAndTheJSONFormsReadBackUnchanged() throws {
        let status = Self.sample()
        #expect(try HostStatus(plist: status.plist) == status)
        let json = try JSONEncoder().encode(status)
        let back = try JSONDecoder().decode(HostStatus.self, from: json)
        #expect(back == status)
        #expect(back.recentCrashes.first?.time == 1_795_000_000.25, "seconds since 1970, not 2001")
        #expect(status.totals.requests == 4 && status.totals.quarantines == 1)
    }

    /// The plist is written out field by field (the daemon builds one per `status`); it must be exactly the
    /// Codable form, with every optional present and absent.
    @Test func thePlistIsTheCodableForm() throws {
        var status = Self.sample()
        #expect(status.plist == (try PlistValueEncoder().encode(status)))
        status.extensions[0].retryInSeconds = 2.5
        status.extensions[0].latencyP99Milliseconds = 9
        status.extensions[0].latencyP50Milliseconds = nil
        status.extensions[0].pools.append(PoolStatus(app: "0/b", state: .quarantined, crashCount: 3, retryInSeconds: 1.25, backoffSeconds: 20))
        status.extensions[0].workers.append(WorkerStatus(pid: 43, app: nil, uptimeSeconds: 0, inFlight: 0, requestsServed: 0,
                                                         recycling: true, sandbox: [], sandboxSkipped: ["landlock"]))
        status.extensions.append(ExtensionStatus(
            identifier: "y", state: .quarantined, crashCount: 0, retryInSeconds: nil, requests: 0, completions: 0,
            cancellations: 0, interruptions: 0, interruptionsByReason: [:], latencyP50Milliseconds: nil,
            latencyP99Milliseconds: nil, slowRequests: 2, slowRequestsPer1000: 1.5, slowRequestSeconds: 3.25, crashes: 0,
            hangKills: 1, timeouts: 2, overloads: 3, protocolViolations: 4, spawns: 5, recycles: 6, quarantines: 7,
            leaks: 8, pools: [], workers: [], problem: "/e/Info.plist: MaxWorkers: 0 is outside 1...64"))
        status.totals = StatusTotals(adding: status.extensions)
        // The reports' optional fields, each way: a crash with no app and a fatal error line, a leak with an app.
        status.recentCrashes.append(CrashReport(extensionIdentifier: "y", pid: 7, reason: .exited(3), time: 12.5,
                                                inFlightRequests: [RequestID(), RequestID()], stderrTail: "a\nFatal error: b\n"))
        var leak = status.recentLeaks[0]
        leak.app = "0/b"
        status.recentLeaks.append(leak)
        #expect(status.plist == (try PlistValueEncoder().encode(status)))
        #expect(try HostStatus(plist: status.plist) == status)
    }

    @Test func anOlderDaemonsStatusAndAReportThatDoesNotReadStillRead() throws {
        guard case .dictionary(var top) = Self.sample().plist,
            case .array(var extensions)? = top["extensions"], case .dictionary(var ext) = extensions[0],
            case .array(var workers)? = ext["workers"], case .dictionary(var worker) = workers[0]
        else {
            Issue.record("the status plist is not shaped as expected")
            return
        }
        worker["sandboxMicroseconds"] = nil  // not sent before this version
        workers[0] = .dictionary(worker)
        ext["workers"] = .array(workers)
        extensions[0] = .dictionary(ext)
        top["extensions"] = .array(extensions)
        top["recentCrashes"] = .array([["extension": "x"], top["recentCrashes"]!.arrayValue![0]])  // one without pid, reason, time
        let read = try HostStatus(plist: .dictionary(top))
        #expect(read.extensions[0].workers[0].sandboxMicroseconds == [:])
        #expect(read.recentCrashes.count == 1 && read.recentCrashes[0].pid == 41, "the unreadable report is skipped")
        top["pid"] = nil
        #expect(throws: DecodingError.self) { try HostStatus(plist: .dictionary(top)) }
    }
}
