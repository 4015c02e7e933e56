// `sdk-host demo`: the first thing a newcomer runs. An embedded host with the bundled extensions runs echo,
// every Crasher fault, a deadline, an app's cancel, echo again, the sandbox escapes and a host service (the
// Renderer asks the app for the parts of a document it cannot read itself), then a Python echo and the C
// Crasher's faults (the same protocol in other languages); a second host shows a
// crash loop ending in quarantine. It prints what happened to each request and checks that every request got
// exactly one terminal callback.
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

    /// The faults both Crashers show, each with its own outcome (the hang with a deadline has a row of its own).
    static let faults = ["segv", "abort", "range", "exit", "kill", "garbage", "oversize", "truncate", "unknownid", "cancel", "double"]

    /// A Crasher's rows: echo, each fault, and a hang with a 1 s deadline.
    static func crasherSteps(_ name: String, _ extensionID: String) -> [Step] {
        [Step(label: "\(name) echo", extensionID: extensionID, input: "echo")]
            + faults.map { Step(label: "\(name) \($0)", extensionID: extensionID, input: $0, isFault: true) }
            + [Step(label: "\(name) hang, 1 s deadline", extensionID: extensionID, input: "hang", deadline: 1, isFault: true)]
    }

    static let steps: [Step] = [
        Step(label: "echo", extensionID: "com.example.echo", input: "hello"),
    ] + crasherSteps("crasher", "com.example.crasher") + [
        Step(label: "crasher slow:50", extensionID: "com.example.crasher", input: "slow:50"),
        Step(label: "app cancels slow:5000", extensionID: "com.example.crasher", input: "slow:5000", cancelAfterMs: 50),
        Step(label: "echo again", extensionID: "com.example.echo", input: "still here"),
        // Escaper tries to get out of its sandbox; each attempt is refused and the worker keeps serving.
        Step(label: "escaper read /etc/shadow", extensionID: "com.example.escaper", input: "read:/etc/shadow"),
        Step(label: "escaper signal pid 1", extensionID: "com.example.escaper", input: "signal:1"),
        Step(label: "escaper fork", extensionID: "com.example.escaper", input: "fork"),
        Step(label: "escaper tcp 127.0.0.1:9", extensionID: "com.example.escaper", input: "tcp:9"),
        // A host service: the sandboxed Renderer cannot read the document's parts; it asks the app (`demoParts`).
        Step(label: "renderer calls app twice", extensionID: "com.example.renderer", input: "Dear {{name}}, see {{page}}"),
    ]

    /// Extensions in other languages on the same protocol (docs/PROTOCOL.md), under the same strict sandbox: a
    /// Python echo, and the C Crasher with every fault the Swift one has and the same outcome for each.
    static let languageSteps: [Step] = [
        Step(label: "python echo", extensionID: "com.example.echo-python", input: "hello from Python"),
    ] + crasherSteps("c crasher", "com.example.crasher-c") + [
        Step(label: "app cancels c slow:5000", extensionID: "com.example.crasher-c", input: "slow:5000", cancelAfterMs: 50),
        Step(label: "python echo again", extensionID: "com.example.echo-python", input: "still here"),
    ]

    /// The parts the demo's app gives the Renderer through its `document.part` service.
    static let demoParts = ["name": "Ada", "page": "page 2"]

    /// Quarantine, on a host of its own with the default restart limit lowered to 3: three crashes in a row,
    /// then a request that ends at once without a worker.
    static let quarantineLimit = 3
    static let quarantineSteps: [Step] = (1...quarantineLimit).map {
        Step(label: "crasher segv (\($0) of \(quarantineLimit))", extensionID: "com.example.crasher", input: "segv", isFault: true)
    } + [Step(label: "crasher echo, quarantined", extensionID: "com.example.crasher", input: "echo")]

    static let usage = """
        usage: sdk-host demo [--config PATH]
          Runs echo, every crash fault, a deadline, an app's cancel, the sandbox escapes, a host service, a Python
          echo and the C Crasher's faults through an embedded host, then a crash loop into quarantine on a second
          host, and prints what happened to each request.
          --config (or $SDKHOST_CONFIG) gives the extension paths and limits.
        """

    /// The requests of one host, and how to count their callbacks.
    struct Run {
        var ids: [RequestID] = []
        var waiters: [OutcomeWaiter] = []
        func count(_ id: RequestID) -> Int { waiters.reduce(0) { $0 + $1.callbackCount(id) } }
        var exactlyOnce: Bool {
            let answered = waiters.reduce(Set<RequestID>()) { $0.union($1.idsWithCallbacks) }
            return ids.allSatisfy { count($0) == 1 } && answered == Set(ids)
        }
        var violations: [String] { ids.filter { count($0) != 1 }.map { "\($0): \(count($0)) callbacks" } }
    }

    static func run(_ arguments: [String]) {
        let options = Options(arguments, valued: ["--config"], boolean: [], usage: usage)
        if let extra = options.positionals.first { fail("unexpected argument '\(extra)'", status: ExitStatus.usage, usage: usage) }
        EmbeddedHost.configure(from: options)
        let began = monotonicMs()
        // The table reports every outcome; the host's own log lines would only interleave with it. The demo
        // crashes the Crasher more often than its restart limit allows: that limit is shown on a host of its own.
        let host = EmbeddedHost.make {
            $0.logHandler = { _, _ in }
            $0.defaultPolicy.restartLimitBurst = 1000
        }
        print("sdk-host demo: an embedded host runs the bundled extensions in real worker processes.")
        print("Extensions found: \(host.extensionIdentifiers.joined(separator: ", "))\n")
        print(row("#", "request", "outcome", "detail", "pid", "ms"))
        let main = runSteps(steps, on: host, numberedFrom: 1)
        print("\nOther languages, the same protocol and sandbox: a Python echo, and the C Crasher's faults.")
        let languages = runSteps(languageSteps, on: host, numberedFrom: steps.count + 1)
        let (status, crashes) = runAsync { (await host.status(), await host.crashReportsInMemory()) }
        let workers = status?.extensions.flatMap(\.workers) ?? []
        BenchCommand.shutdown(host)

        print("\nQuarantine: a second host whose restart limit is \(quarantineLimit) crashes in 10 s.")
        let strict = EmbeddedHost.make {
            $0.logHandler = { _, _ in }
            $0.defaultPolicy.restartLimitBurst = quarantineLimit
            $0.defaultPolicy.firstQuarantine = .seconds(10)
        }
        let quarantine = runSteps(quarantineSteps, on: strict, numberedFrom: steps.count + languageSteps.count + 1)
        let crasher = runAsync { await strict.status()?.extensions.first { $0.identifier == "com.example.crasher" } }
        if let crasher {
            let retry = crasher.retryInSeconds.map { " in \(format1($0)) s" } ?? ""
            print("    com.example.crasher is \(crasher.state): \(crasher.crashCount) crashes; it is tried again\(retry), "
                + "and the wait doubles at each new quarantine, up to 5 min.")
        }
        BenchCommand.shutdown(strict)

        let faults = (steps + languageSteps + quarantineSteps).filter(\.isFault).count
        let total = main.ids.count + languages.ids.count + quarantine.ids.count
        print("")
        print("Workers spawned: \(status?.totals.spawns ?? 0); crash reports recorded: \(crashes.count).")
        let layers = workers.first?.sandbox ?? []
        print("Workers run sandboxed (Sandbox = strict): " + (layers.isEmpty ? "no layers reported" : layers.joined(separator: ", ")) + ".")
        if let range = crashes.first(where: { $0.stderrTail.contains("Index out of range") }) {
            print("  e.g. pid \(range.pid) (\(range.reason)): \"\(range.stderrTail.split(separator: "\n").first ?? "")\"")
        }
        guard main.exactlyOnce && languages.exactlyOnce && quarantine.exactlyOnce, crasher?.state == .quarantined else {
            fail("demo: " + (main.violations + languages.violations + quarantine.violations).joined(separator: "; ")
                + (crasher?.state == .quarantined ? "" : " the Crasher was not quarantined"))
        }
        print("The host survived \(faults) faults; every one of \(total) requests ended exactly once "
            + "(\(format1((monotonicMs() - began) / 1000)) s).")
    }

    /// Runs `steps` on `host` in order, each to its one callback, printing a row for each.
    static func runSteps(_ steps: [Step], on host: ExtensionHost, numberedFrom first: Int) -> Run {
        var run = Run()
        var extensions: [String: (ext: Extension, waiter: OutcomeWaiter)] = [:]
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
                if step.extensionID == "com.example.renderer" {
                    try? ext.registerService("document.part") { call in
                        let name = call.items.first?.title ?? ""
                        guard let part = demoParts[name] else {
                            throw ExtensionError(domain: "sdk-host.demo", code: 1, message: "no part '\(name)'")
                        }
                        return [ExtensionItem(text: part)]
                    }
                }
                extensions[step.extensionID] = (ext, waiter)
                run.waiters.append(waiter)
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
            run.ids.append(id)
            if let delay = step.cancelAfterMs {
                _ = assigned.wait(timeout: .now() + 10)
                usleep(UInt32(delay) * 1000)
                ext.cancelRequest(id)
            }
            guard let result = waiter.wait(for: id, timeout: 30) else {
                fail("demo: request \(first + n) (\(step.label)) got no callback within 30 s")
            }
            let elapsed = monotonicMs() - start
            let (outcome, detail) = describe(result)
            let pidText = pid.withLock { $0 }.map(String.init) ?? "-"
            print(row("\(first + n)", step.label, outcome, detail, pidText, String(format1(elapsed))))
        }
        // Give stray duplicate callbacks (there must be none) time to show up before they are counted.
        usleep(200_000)
        return run
    }

    /// The outcome column and its detail.
    static func describe(_ outcome: RequestOutcome) -> (String, String) {
        switch outcome {
        case .completed(let items): ("completed", items.map { $0.title ?? $0.text.map { "\"\($0)\"" } ?? "-" }.joined(separator: ", ").displaySafe())
        case .cancelled(let error): ("cancelled", error.description.displaySafe())
        case .interrupted(let reason): ("interrupted", reason.description.displaySafe())
        }
    }

    static func row(_ n: String, _ label: String, _ outcome: String, _ detail: String, _ pid: String, _ ms: String) -> String {
        let clipped = detail.count > 54 ? String(detail.prefix(53)) + "…" : detail
        return pad(n, 3) + pad(label, 30) + pad(outcome, 13) + pad(clipped, 56) + pad(pid, 8) + ms
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
