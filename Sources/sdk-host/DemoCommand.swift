// `sdk-host demo`: the first thing a newcomer runs. An embedded host with the bundled extensions runs echo,
// every Crasher fault, a host-side cancel, and echo again, then prints what happened to each request and checks
// that every request got exactly one terminal callback.
import Dispatch
import SDKHost
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

enum DemoCommand {
    struct Step {
        let label: String
        let extensionID: String
        let input: String
        var deadline: Double? = nil
        var cancelAfterMs: Int? = nil
        var isFault = false
    }

    static let steps: [Step] = [
        Step(label: "echo", extensionID: "com.example.echo", input: "hello"),
        Step(label: "crasher echo", extensionID: "com.example.crasher", input: "echo"),
    ] + ["segv", "abort", "range", "exit", "kill", "garbage", "oversize", "truncate", "unknownid", "cancel", "double"].map {
        Step(label: "crasher \($0)", extensionID: "com.example.crasher", input: $0, isFault: true)
    } + [
        Step(label: "crasher hang (1 s deadline)", extensionID: "com.example.crasher", input: "hang", deadline: 1, isFault: true),
        Step(label: "crasher slow:50", extensionID: "com.example.crasher", input: "slow:50"),
        Step(label: "host cancel of slow:5000", extensionID: "com.example.crasher", input: "slow:5000", cancelAfterMs: 50),
        Step(label: "echo again", extensionID: "com.example.echo", input: "still here"),
        // Escaper tries to get out of its sandbox; each attempt is refused and the worker keeps serving.
        Step(label: "escaper read /etc/shadow", extensionID: "com.example.escaper", input: "read:/etc/shadow"),
        Step(label: "escaper signal pid 1", extensionID: "com.example.escaper", input: "signal:1"),
        Step(label: "escaper fork", extensionID: "com.example.escaper", input: "fork"),
        Step(label: "escaper tcp 127.0.0.1:9", extensionID: "com.example.escaper", input: "tcp:9"),
    ]

    static let usage = """
        usage: sdk-host demo [--config PATH]
          Runs echo, every crash fault, a hang, a cancel and the sandbox escapes through an embedded host and prints
          what happened to each request. --config (or $SDKHOST_CONFIG) gives the extension paths and limits.
        """

    static func run(_ arguments: [String]) {
        let options = Options(arguments, valued: ["--config"], boolean: [], usage: usage)
        if let extra = options.positionals.first { fail("unexpected argument '\(extra)'\n\(usage)", status: ExitStatus.usage) }
        EmbeddedHost.configure(from: options)
        // The table reports every outcome; the host's own log lines would only interleave with it.
        let host = EmbeddedHost.make { $0.logHandler = { _, _ in } }
        var extensions: [String: (ext: Extension, waiter: OutcomeWaiter)] = [:]
        print("sdk-host demo: an embedded host runs the bundled extensions in real worker processes.")
        print("Extensions found: \(host.extensionIdentifiers.joined(separator: ", "))\n")
        print(row("#", "request", "outcome", "detail", "pid", "ms"))
        var ids: [RequestID] = []
        for (n, step) in steps.enumerated() {
            let ext: Extension, waiter: OutcomeWaiter
            if let cached = extensions[step.extensionID] {
                (ext, waiter) = cached
            } else {
                do {
                    ext = try host.extension(identifier: step.extensionID)
                } catch {
                    fail("demo: \(error) (build the extensions with `swift build`)", status: ExitStatus.usage)
                }
                waiter = OutcomeWaiter(attachingTo: ext)
                extensions[step.extensionID] = (ext, waiter)
            }
            let pid = Mutex<pid_t?>(nil)
            let assigned = DispatchSemaphore(value: 0)
            let start = monotonicMs()
            let id = ext.beginRequest(
                withInputItems: [ExtensionItem(title: step.input)], deadline: step.deadline,
                onWorkerAssigned: { p in
                    pid.withLock { $0 = p }
                    assigned.signal()
                })
            ids.append(id)
            if let delay = step.cancelAfterMs {
                _ = assigned.wait(timeout: .now() + 10)
                usleep(UInt32(delay) * 1000)
                ext.cancelRequest(id)
            }
            guard let result = waiter.wait(for: id, timeout: 30) else {
                fail("demo: request \(n + 1) (\(step.label)) got no callback within 30 s")
            }
            let elapsed = monotonicMs() - start
            let (outcome, detail) = describe(result)
            let pidText = pid.withLock { $0 }.map(String.init) ?? "-"
            print(row("\(n + 1)", step.label, outcome, detail, pidText, String(format1(elapsed))))
        }
        // Give stray duplicate callbacks (there must be none) time to show up before counting.
        usleep(300_000)
        let waiters = extensions.values.map(\.waiter)
        func count(_ id: RequestID) -> Int { waiters.reduce(0) { $0 + $1.callbackCount(id) } }
        let answered = waiters.reduce(Set<RequestID>()) { $0.union($1.idsWithCallbacks) }
        let exactlyOnce = ids.allSatisfy { count($0) == 1 } && answered == Set(ids)
        let stats = Mutex<(HostStatistics, [CrashReport], [WorkerSnapshot])?>(nil)
        let inspected = DispatchSemaphore(value: 0)
        host.inspect { s, crashes, workers in
            stats.withLock { $0 = (s, crashes, workers) }
            inspected.signal()
        }
        inspected.wait()
        let (statistics, crashes, workers) = stats.withLock { $0 }!
        let faults = steps.filter(\.isFault).count
        print("")
        print("Workers spawned: \(statistics.spawns); crash reports recorded: \(crashes.count).")
        let layers = workers.first?.sandboxLayers ?? []
        print("Workers run sandboxed (Sandbox = strict): " + (layers.isEmpty ? "no layers reported" : layers.joined(separator: ", ")) + ".")
        if let range = crashes.first(where: { $0.stderrTail.contains("Index out of range") }) {
            print("  e.g. pid \(range.pid) (\(range.reason)): \"\(range.stderrTail.split(separator: "\n").first ?? "")\"")
        }
        let shutdown = DispatchSemaphore(value: 0)
        host.shutdown { shutdown.signal() }
        shutdown.wait()
        if exactlyOnce {
            print("The host survived \(faults) faults; every one of \(ids.count) requests ended exactly once.")
        } else {
            let wrong = ids.filter { count($0) != 1 }.map { "\($0): \(count($0)) callbacks" }
            fail("demo: exactly-once violated: \(wrong.joined(separator: "; "))")
        }
    }

    /// The outcome column and its detail.
    static func describe(_ outcome: RequestOutcome) -> (String, String) {
        switch outcome {
        case .completed(let items): ("completed", items.map { $0.title ?? "-" }.joined(separator: ", "))
        case .cancelled(let error): ("cancelled", error.description)
        case .interrupted(let reason): ("interrupted", reason.description)
        }
    }

    static func row(_ n: String, _ label: String, _ outcome: String, _ detail: String, _ pid: String, _ ms: String) -> String {
        let clipped = detail.count > 56 ? String(detail.prefix(55)) + "…" : detail
        return pad(n, 3) + pad(label, 28) + pad(outcome, 13) + pad(clipped, 58) + pad(pid, 8) + ms
    }

    static func pad(_ s: String, _ width: Int) -> String { s + String(repeating: " ", count: max(1, width - s.count)) }
    static func format1(_ v: Double) -> String {
        let tenths = Int((v * 10).rounded())
        return "\(tenths / 10).\(tenths % 10)"
    }
}

func monotonicMs() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) * 1000 + Double(ts.tv_nsec) / 1e6
}
