// `sdk-host bench --soak N [--json]`: the host's own memory discipline, shown. An embedded host runs N requests
// against com.example.crasher, 64 in flight, with real crashes, cancels and deadlines mixed in, and prints its
// resident memory, descriptors, threads and live workers at intervals, then the slope of RSS in bytes per
// request over the last three quarters of the run (the first quarter warms allocators and tables up).
//
// It also checks what it can from outside: every request ended with exactly one callback (no more arrive after
// the last), and after shutdown no worker process is left and descriptors and threads are back near where they
// started. Exit status 0 if so, 1 if not; the slope itself is a measurement, not a verdict.
import Dispatch
import SDKHost
import SDKPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

enum SoakCommand {
    struct Sample {
        var requests: Int
        var rssKB: Int
        var descriptors: Int
        var threads: Int
        var workers: Int
    }

    /// Every `crashEvery`th request crashes its worker (SIGSEGV), every `cancelEvery`th is cancelled as soon as
    /// it is begun, every `deadlineEvery`th (offset by half) has a 5 ms deadline on a 50 ms request.
    static let crashEvery = 1000, cancelEvery = 100, deadlineEvery = 500
    static let inFlight = 64

    static func run(total: Int, json: Bool) {
        guard total > 0 else { fail("usage: sdk-host bench --soak N  (N > 0 requests)", status: 2) }
        let host = EmbeddedHost.make {
            $0.logHandler = { _, _ in }
            // Crashes here are the workload, not a crash loop to quarantine.
            $0.defaultPolicy.restartLimitBurst = 1000
            $0.defaultPolicy.restartLimitInterval = .seconds(0.1)
            $0.crashReportLimit = 16
        }
        let ext: Extension
        do {
            ext = try host.extension(identifier: "com.example.crasher")
        } catch {
            fail("bench --soak: \(error)")
        }
        let callbacks = Atomic<Int>(0)
        let outcomes = Mutex<[String: Int]>([:])
        let slots = DispatchSemaphore(value: inFlight)
        let finished = DispatchSemaphore(value: 0)
        @Sendable func ended(_ kind: String) {
            outcomes.withLock { $0[kind, default: 0] += 1 }
            slots.signal()
            if callbacks.add(1, ordering: .relaxed).newValue == total { finished.signal() }
        }
        ext.callsHandlersOnHostLoop = true  // the cheapest path; the handlers only count
        ext.requestCompletionHandler = { _, _ in ended("completed") }
        ext.requestCancellationHandler = { _, _ in ended("cancelled") }
        ext.requestInterruptionHandler = { _, reason in ended(reason.kind) }

        let start = snapshot(requests: 0)
        var samples = [start]
        let interval = max(1, total / 20)
        let began = nowMicros()
        let echo = [ExtensionItem(title: "echo")], segv = [ExtensionItem(title: "segv")]
        let slow = [ExtensionItem(title: "slow:50")]
        for i in 1...total {
            slots.wait()
            if i % crashEvery == 0 {
                _ = ext.beginRequest(withInputItems: segv)
            } else if i % cancelEvery == 0 {
                ext.cancelRequest(ext.beginRequest(withInputItems: slow))
            } else if i % deadlineEvery == deadlineEvery / 2 {
                _ = ext.beginRequest(withInputItems: slow, deadline: 0.005)
            } else {
                _ = ext.beginRequest(withInputItems: echo)
            }
            if i % interval == 0 { samples.append(snapshot(requests: i)) }
        }
        finished.wait()
        let seconds = (nowMicros() - began) / 1e6
        usleep(500_000)  // a second callback for any request would arrive by now
        let callbackCount = callbacks.load(ordering: .relaxed)
        let end = snapshot(requests: total)
        BenchCommand.shutdown(host)
        usleep(200_000)  // let the loop thread and the reaped workers' descriptors go
        let after = snapshot(requests: total)

        let slope = slopeBytesPerRequest(samples)
        let exactlyOnce = callbackCount == total
        // One descriptor or thread of slack: Dispatch may keep a worker thread parked for a while.
        let clean = after.workers == 0 && after.descriptors <= start.descriptors + 1 && after.threads <= start.threads + 2
        let byKind = outcomes.withLock { $0 }
        if json {
            var fields = [
                "\"requests\":\(total)", "\"seconds\":\(fixed(seconds, 3))", "\"requests_per_second\":\(fixed(Double(total) / seconds, 0))",
                "\"callbacks\":\(callbackCount)", "\"slope_bytes_per_request\":\(fixed(slope, 3))",
                "\"rss_start_kb\":\(start.rssKB)", "\"rss_end_kb\":\(end.rssKB)",
                "\"descriptors_start\":\(start.descriptors)", "\"descriptors_after_shutdown\":\(after.descriptors)",
                "\"threads_start\":\(start.threads)", "\"threads_after_shutdown\":\(after.threads)",
                "\"workers_after_shutdown\":\(after.workers)",
            ]
            fields.append("\"outcomes\":{" + byKind.keys.sorted().map { "\"\($0)\":\(byKind[$0]!)" }.joined(separator: ",") + "}")
            print("{" + fields.joined(separator: ",") + "}")
        } else {
            print("soak: \(total) requests to com.example.crasher, \(inFlight) in flight; every \(crashEvery)th crashes "
                + "its worker, every \(cancelEvery)th is cancelled, every \(deadlineEvery)th misses a 5 ms deadline")
            print(padRight("requests", 12) + padRight("RSS KiB", 10) + padRight("fds", 6) + padRight("threads", 9) + "workers")
            for s in samples {
                print(padRight(String(s.requests), 12) + padRight(String(s.rssKB), 10) + padRight(String(s.descriptors), 6)
                    + padRight(String(s.threads), 9) + String(s.workers))
            }
            print("outcomes: " + byKind.keys.sorted().map { "\($0) \(byKind[$0]!)" }.joined(separator: ", "))
            print("\(fixed(seconds, 1)) s, \(fixed(Double(total) / seconds, 0)) requests/s; \(callbackCount) callbacks "
                + "for \(total) requests")
            print("RSS slope over the last 3/4: \(fixed(slope, 2)) bytes per request (RSS \(start.rssKB) → \(end.rssKB) KiB)")
            print("after shutdown: \(after.workers) worker processes, \(after.descriptors) descriptors (\(start.descriptors) "
                + "at start), \(after.threads) threads (\(start.threads) at start)")
        }
        if !exactlyOnce { fail("bench --soak: \(callbackCount) callbacks for \(total) requests") }
        if !clean { fail("bench --soak: resources left after shutdown") }
        exit(0)
    }

    static func snapshot(requests: Int) -> Sample {
        let fields = procStatus("self", ["VmRSS:", "Threads:"])
        return Sample(requests: requests, rssKB: fields[0], descriptors: (listDirectory("/proc/self/fd") ?? []).count - 1,
                      threads: fields[1], workers: liveChildren())
    }

    /// Children of this process that are not zombies (every thread's `children` list).
    static func liveChildren() -> Int {
        var count = 0
        for task in listDirectory("/proc/self/task") ?? [] {
            guard let bytes = try? readFile("/proc/self/task/\(task)/children") else { continue }
            for pid in String(decoding: bytes, as: UTF8.self).split(separator: " ") {
                let stat = (try? readFile("/proc/\(pid)/stat")).map { String(decoding: $0, as: UTF8.self) } ?? ""
                if let close = stat.lastIndex(of: ")"), stat[stat.index(close, offsetBy: 2)...].first != "Z" { count += 1 }
            }
        }
        return count
    }

    /// Least-squares slope of RSS against requests over the samples past the first quarter, in bytes per request.
    static func slopeBytesPerRequest(_ samples: [Sample]) -> Double {
        let tail = samples.filter { $0.requests >= samples.last!.requests / 4 }
        guard tail.count >= 2 else { return .nan }
        let n = Double(tail.count)
        let xs = tail.map { Double($0.requests) }, ys = tail.map { Double($0.rssKB) * 1024 }
        let mx = xs.reduce(0, +) / n, my = ys.reduce(0, +) / n
        let sxy = zip(xs, ys).reduce(0) { $0 + ($1.0 - mx) * ($1.1 - my) }
        let sxx = xs.reduce(0) { $0 + ($1 - mx) * ($1 - mx) }
        return sxx > 0 ? sxy / sxx : .nan
    }
}
