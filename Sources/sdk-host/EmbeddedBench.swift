// The bench's embedded-host figures: the warm round trip, requests/s in flight, cold and prewarmed starts, an
// Echo worker's memory, SIGKILL → interruption and the shutdown drain, each through the public API as an app
// would use it (`sdk-host bench`, BenchCommand.swift, runs them).
import CSDKShim
import Dispatch
import SDKHost
import SDKPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

enum EmbeddedBench {
    /// One item shaped like SampleMessages.begin, so the begin frame is the same ~310 bytes as the raw message.
    static let item: ExtensionItem = {
        let message = SampleMessages.begin
        return try! ExtensionItem(plist: message["items"]![0]!)
    }()

    static func echo(_ host: ExtensionHost) -> Extension {
        do {
            return try host.extension(identifier: "com.example.echo")
        } catch {
            fail("bench: \(error)")
        }
    }

    static func warmRoundTrips(_ host: ExtensionHost, count: Int, onHostLoop: Bool = false,
                               extension identifier: String = "com.example.echo") -> Samples {
        let ext: Extension
        do {
            ext = try host.extension(identifier: identifier)
        } catch {
            fail("bench: \(error)")
        }
        ext.callsHandlersOnHostLoop = onHostLoop
        let done = DispatchSemaphore(value: 0)
        ext.requestCompletionHandler = { _, _ in done.signal() }
        ext.requestInterruptionHandler = { _, reason in fail("bench: \(identifier) interrupted: \(reason)") }
        var samples = Samples()
        for i in 0..<(count + count / 10) {
            let start = nowMicros()
            ext.beginRequest(withInputItems: [item])
            done.wait()
            if i >= count / 10 { samples.add(nowMicros() - start) }
        }
        return samples
    }

    /// Requests per second with `inFlight` outstanding at all times.
    /// Keeps at most `inFlight` of `total` requests running: wait on `slots` before each begin; `finished` is
    /// signalled when the last has completed.
    static func window(_ ext: Extension, inFlight: Int, total: Int) -> (slots: DispatchSemaphore, finished: DispatchSemaphore) {
        let slots = DispatchSemaphore(value: inFlight)
        let finished = DispatchSemaphore(value: 0)
        let remaining = Atomic<Int>(total)
        ext.requestCompletionHandler = { _, _ in
            slots.signal()
            if remaining.subtract(1, ordering: .relaxed).newValue == 0 { finished.signal() }
        }
        return (slots, finished)
    }

    static func pipelined(_ host: ExtensionHost, inFlight: Int, total: Int, onHostLoop: Bool = false) -> Double {
        let ext = echo(host)
        ext.callsHandlersOnHostLoop = onHostLoop
        let (slots, finished) = window(ext, inFlight: inFlight, total: total)
        let start = nowMicros()
        for _ in 0..<total {
            slots.wait()
            ext.beginRequest(withInputItems: [item])
        }
        finished.wait()
        return Double(total) / ((nowMicros() - start) / 1e6)
    }

    /// The warm Echo worker's VmRSS and the part of it that is its executable's text (`textRSSKB`), in KiB.
    static func echoWorkerRSS(_ host: ExtensionHost) -> (Int, text: Int) {
        let ext = echo(host)
        let pid = Mutex<pid_t?>(nil)
        let done = DispatchSemaphore(value: 0)
        ext.requestCompletionHandler = { _, _ in done.signal() }
        ext.beginRequest(withInputItems: [item], deadline: nil, onWorkerAssigned: { p in pid.withLock { $0 = p } })
        done.wait()
        guard let p = pid.withLock({ $0 }) else { return (-1, -1) }
        return (rssKB(of: p), textRSSKB(of: p))
    }

    /// A quiet host whose crash-loop limit is out of the kill figure's way: it kills a worker per sample, and that
    /// is measurement, not a crash loop to quarantine.
    static func hostForKills() -> ExtensionHost {
        EmbeddedHost.make {
            $0.logHandler = { _, _ in }
            $0.defaultPolicy.restartLimitBurst = 1000
        }
    }

    /// SIGKILL of a worker running a request → that request's interruption callback, in µs; and, in the same
    /// samples, SIGKILL → the worker's pidfd readable as this thread sees it: when the kernel has torn the process
    /// down and reports it dead. The host learns of the death from its socket's end, which the kernel closes in
    /// the same teardown, so the first figure cannot be much below the second.
    static func killToInterruption(_ host: ExtensionHost, samples count: Int) -> (Samples, exit: Samples) {
        guard let ext = try? host.extension(identifier: "com.example.crasher") else { fail("bench: no crasher") }
        let interrupted = DispatchSemaphore(value: 0)
        let at = Mutex<Double>(0)
        ext.requestInterruptionHandler = { _, _ in
            at.withLock { $0 = nowMicros() }
            interrupted.signal()
        }
        var samples = Samples()
        var exits = Samples()
        for _ in 0..<count {
            // A handshaken worker first: one killed before its handshake ran no handler, so its request is
            // queued for the next worker instead of interrupted (and this loop would wait for it forever).
            guard runAsync({ try? await ext.prewarm() }) != nil else { fail("bench: cannot start a crasher worker") }
            let assigned = DispatchSemaphore(value: 0)
            let pid = Mutex<pid_t?>(nil)
            ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:60000")], deadline: 120, onWorkerAssigned: { p in
                pid.withLock { $0 = p }
                assigned.signal()
            })
            assigned.wait()
            usleep(20_000)  // let the worker start running the request
            let worker = pid.withLock { $0 }!
            let pidfd = sdk_pidfd_open(worker)
            let start = nowMicros()
            kill(worker, SIGKILL)
            if pidfd >= 0 {
                if readable(pidfd, withinMilliseconds: 10_000) { exits.add(nowMicros() - start) }
                close(pidfd)
            }
            guard interrupted.wait(timeout: .now() + 30) == .success else {
                fail("bench: the request on worker pid \(worker) was not interrupted within 30 s of its SIGKILL")
            }
            samples.add(at.withLock { $0 } - start)
        }
        return (samples, exits)
    }

    /// `queued` requests waiting behind busy workers, then `shutdown()`: µs per request from the call to the last
    /// interruption callback. Equal figures at 2k and 32k show the drain is linear (the first slice was quadratic).
    static func shutdownDrain(queued: Int) -> Double {
        let host = EmbeddedHost.make {
            $0.logHandler = { _, _ in }
            $0.maxQueuedRequests = queued + 64
        }
        guard let ext = try? host.extension(identifier: "com.example.crasher") else { fail("bench: no crasher") }
        let ended = Atomic<Int>(0)
        let allEnded = DispatchSemaphore(value: 0)
        let busy = 32  // the Crasher's MaxWorkers 4 × MaxConcurrentRequests 8
        let total = busy + queued
        ext.callsHandlersOnHostLoop = true
        ext.requestInterruptionHandler = { _, _ in
            if ended.add(1, ordering: .relaxed).newValue == total { allEnded.signal() }
        }
        let running = DispatchSemaphore(value: 0)
        let long = [ExtensionItem(title: "slow:60000")]
        for _ in 0..<busy {
            _ = ext.beginRequest(withInputItems: long, deadline: 120, onWorkerAssigned: { _ in running.signal() })
        }
        for _ in 0..<busy { running.wait() }
        for _ in 0..<queued { _ = ext.beginRequest(withInputItems: long, deadline: 120) }
        let start = nowMicros()
        host.shutdown {}
        allEnded.wait()
        let perRequest = (nowMicros() - start) / Double(total)
        BenchCommand.shutdown(host)
        return perRequest
    }

    /// Requests per second at 1, 8 and 64 in flight, and at 64 with handlers on the host loop; then the app's and
    /// its workers' CPU per request at 64 in flight.
    static func measureThroughput(_ host: ExtensionHost, into results: inout Results, scale: Int) {
        for depth in [1, 8, 64] {
            results.rps[depth] = pipelined(host, inFlight: depth, total: 4000 * scale)
        }
        results.rpsOnLoop64 = pipelined(host, inFlight: 64, total: 4000 * scale, onHostLoop: true)
        // Over a longer run than the req/s figures.
        let count = 20_000
        (results.embeddedAppCPUPerRequestUs, results.embeddedWorkerCPUPerRequestUs) =
            CPUSplit.perRequest(requests: count, workersOf: getpid()) {
                _ = pipelined(host, inFlight: 64, total: count)
            }
    }

    /// Cold starts with the default sandbox, without it, without the launcher, and with the pid namespace
    /// AllowSubprocesses adds.
    static func measureColdStarts(into results: inout Results, samples: Int) {
        (results.cold, results.prewarmed) = coldStarts(samples: samples)
        results.coldUnsandboxed = coldStarts(samples: samples) {
            $0.defaultPolicy.sandbox = .none
            $0.allowedSandboxModes.insert(.none)
        }.cold
        results.coldDirect = coldStarts(samples: samples) {
            $0.defaultPolicy.sandbox = .none
            $0.allowedSandboxModes.insert(.none)
            $0.launcherPath = "/nonexistent/sdk-host-launcher"  // Sandbox = none without a launcher: spawned directly
        }.cold
        results.coldSubprocesses = coldStarts(samples: samples) { $0.defaultPolicy.allowSubprocesses = true }.cold
        results.bareStart = bareStarts(samples: samples * 4)
        results.sandboxLayers = layerCosts(samples: samples)
    }

    /// Cold starts of another extension (`bench cold --extension ID`, e.g. one built in a package of its own),
    /// under the default sandbox, to set beside Echo's.
    static func coldStarts(of identifier: String, samples count: Int) -> Samples {
        var cold = Samples()
        for _ in 0..<count {
            let host = EmbeddedHost.make { $0.logHandler = { _, _ in } }
            settle(host)
            let ext: Extension
            do {
                ext = try host.extension(identifier: identifier)
            } catch {
                fail("bench: \(error)", status: ExitStatus.usage)
            }
            cold.add(firstRequest(ext))
            BenchCommand.shutdown(host)
        }
        return cold
    }

    /// The bundled echo workers of each language: warm round trip and cold start (to the first reply), measured
    /// the same way, one after the other. The C Crasher echoes by default.
    static let languageEchoes = [("Swift", "com.example.echo"), ("Python", "com.example.echo-python"), ("C", "com.example.crasher-c")]

    static func languages(scale: Int) -> [Results.Language] {
        languageEchoes.map { name, identifier in
            let host = EmbeddedHost.make { $0.logHandler = { _, _ in } }
            let warm = warmRoundTrips(host, count: 1000 * scale, extension: identifier)
            BenchCommand.shutdown(host)
            return Results.Language(name: name, identifier: identifier, warm: warm,
                                    cold: coldStarts(of: identifier, samples: 5 * scale))
        }
    }

    /// Each step of the sandboxed launch, as the launcher times it (`measuresSandboxLayers`), over `count` cold
    /// starts of Echo: in µs, by step, in the launcher's order.
    static func layerCosts(samples count: Int) -> [(step: String, samples: Samples)] {
        var order: [String] = []
        var byStep: [String: Samples] = [:]
        for _ in 0..<count {
            let host = EmbeddedHost.make {
                $0.logHandler = { _, _ in }
                $0.measuresSandboxLayers = true
            }
            settle(host)
            _ = firstRequest(echo(host))
            let steps = runAsync { await host.status()?.extensions.lazy.flatMap(\.workers).first?.sandboxMicroseconds ?? [:] }
            for (step, us) in steps {
                if byStep[step] == nil { order.append(step) }
                byStep[step, default: Samples()].add(Double(us))
            }
            BenchCommand.shutdown(host)
        }
        let launcherOrder = ["session+rlimits", "namespaces", "fork", "grants", "workerUser", "root",
                             "executableSHA256", "noNewPrivs+capabilities", "landlock", "seccomp"]
        return order.sorted { (launcherOrder.firstIndex(of: $0) ?? 99) < (launcherOrder.firstIndex(of: $1) ?? 99) }
            .map { ($0, byStep[$0]!) }
    }

    /// The Echo executable spawned with no host connection until its `main` has run, in µs: posix_spawn, exec,
    /// the static C library's and the Swift runtime's start-up, then the worker runtime's first line (that it has
    /// no connection) on stderr. A cold start does all of this and more, and none of it is sdk-host's.
    static func bareStarts(samples count: Int) -> Samples {
        guard let dir = HostConfiguration.executableDirectory else { fail("bench: no executable directory") }
        var samples = Samples()
        for _ in 0..<count {
            let request = SpawnRequest(path: dir + "/Echo", arguments: ["Echo"], environment: ["SDKHOST_IPC_FD=99"])
            let start = nowMicros()
            guard let channels = try? spawnWithChannels(request) else { fail("bench: cannot spawn \(dir)/Echo") }
            let spoke = readable(channels.stderr.rawValue, withinMilliseconds: 10_000)
            let end = nowMicros()
            guard spoke, readable(channels.process.pidfd.rawValue, withinMilliseconds: 10_000) else {
                channels.terminate(signal: SIGKILL)  // reaped and closed: a failed bench leaves no process behind
                fail("bench: Echo, spawned alone, did not report the missing connection and exit within 10 s")
            }
            samples.add(end - start)
            _ = try? channels.process.reap()
            channels.close()
        }
        return samples
    }

    /// A fresh host with no worker: beginRequest → completion, in µs; and the first request of another fresh
    /// host after `Extension.prewarm()` has returned (the worker spawned and handshaken, as `MinWarmWorkers` does).
    static func coldStarts(samples count: Int, _ tweak: (inout HostConfiguration) -> Void = { _ in })
        -> (cold: Samples, prewarmed: Samples)
    {
        var cold = Samples(), prewarmed = Samples()
        for _ in 0..<count {
            let host = EmbeddedHost.make {
                $0.logHandler = { _, _ in }
                tweak(&$0)
            }
            settle(host)
            cold.add(firstRequest(echo(host)))
            BenchCommand.shutdown(host)
            let warmHost = EmbeddedHost.make {
                $0.logHandler = { _, _ in }
                tweak(&$0)
            }
            let ext = echo(warmHost)
            let ready = DispatchSemaphore(value: 0)
            Task {
                _ = try? await ext.prewarm()
                ready.signal()
            }
            ready.wait()
            prewarmed.add(firstRequest(ext))
            BenchCommand.shutdown(warmHost)
        }
        return (cold, prewarmed)
    }
}

/// Waits until `host` has run the work it queued when it was made (such as making the first worker's temp
/// folder), as an app's host has long before its first request: a cold start is timed from a settled host.
func settle(_ host: ExtensionHost) {
    let settled = DispatchSemaphore(value: 0)
    if host.engine.loop.execute({ settled.signal() }) { settled.wait() }
}

/// One request's beginRequest → completion, in µs.
func firstRequest(_ ext: Extension) -> Double {
    let done = DispatchSemaphore(value: 0)
    ext.requestCompletionHandler = { _, _ in done.signal() }
    let start = nowMicros()
    ext.beginRequest(withInputItems: [EmbeddedBench.item])
    done.wait()
    return nowMicros() - start
}

/// What an API call costs its caller with 64 Echo requests in flight: each `beginRequest` and a `pid(for:)` of a
/// request in flight, timed, and whether the calling thread slept in it (its voluntary context switches,
/// getrusage(RUSAGE_THREAD), went up: it waited on a lock or the kernel). No API call may make its caller wait.
enum APIBench {
    struct Result {
        var begin = Samples(), pid = Samples()
        var beginSleeps = 0, pidSleeps = 0
    }

    static func voluntarySwitches() -> Int {
        var usage = rusage()
        getrusage(1 /* RUSAGE_THREAD: this thread alone */, &usage)
        return usage.ru_nvcsw
    }

    static func measure(_ host: ExtensionHost, total: Int, inFlight: Int = 64) -> Result {
        let ext = EmbeddedBench.echo(host)
        let (slots, finished) = EmbeddedBench.window(ext, inFlight: inFlight, total: total)
        var result = Result()
        result.begin.values.reserveCapacity(total)
        result.pid.values.reserveCapacity(total)
        var recent = [RequestID](repeating: RequestID(), count: 8)
        for i in 0..<total {
            slots.wait()
            let item = [EmbeddedBench.item]
            var switches = voluntarySwitches()
            var start = monotonicNanoseconds()
            let id = ext.beginRequest(withInputItems: item)
            var end = monotonicNanoseconds()
            if voluntarySwitches() != switches { result.beginSleeps += 1 }
            result.begin.add(Double(end - start) / 1000)
            recent[i % recent.count] = id
            // A request begun a few calls ago: most are in flight, with a pid the loop published.
            let asked = recent[(i + 1) % recent.count]
            switches = voluntarySwitches()
            start = monotonicNanoseconds()
            _ = ext.pid(for: asked)
            end = monotonicNanoseconds()
            if voluntarySwitches() != switches { result.pidSleeps += 1 }
            result.pid.add(Double(end - start) / 1000)
        }
        finished.wait()
        return result
    }
}
