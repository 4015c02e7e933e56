// The public API in embedded mode: lookups and their errors, handlers and their queue, pid(for:), perform with
// Task cancellation, per-request deadlines, worker reuse and idle retirement. Real workers throughout.
import SDKWire
import Dispatch
import HostTestSupport
@testable import SDKHost
import SDKPosix
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct HostAPITests {
    /// Two shutdowns in a row: the second is accepted by the loop after the first has already asked it to stop,
    /// and its completion must run all the same (it was lost once, and `bench`'s drain figure hung on it).
    @Test func everyShutdownCompletionRuns() async throws {
        let (host, _) = try makeHost()
        let done = Atomic<Int>(0)
        host.shutdown { done.add(1, ordering: .relaxed) }
        host.shutdown { done.add(1, ordering: .relaxed) }
        #expect(await eventually(timeout: 30) { done.load(ordering: .relaxed) == 2 })
        await host.shutdown()  // and after the loop has stopped, at once
    }

    @Test func unknownExtensionIsAClearError() async throws {
        try await withHost { host, _ in
            #expect(host.extensionIdentifiers == ["com.example.async-echo", "com.example.crasher", "com.example.crasher-c", "com.example.echo",
                                                 "com.example.echo-python", "com.example.escaper", "com.example.renderer", "com.example.ticker"])
            #expect {
                _ = try host.extension(identifier: "com.example.missing")
            } throws: { error in
                let e = error as? HostError
                return e?.code == .unknownExtension && e?.detail.contains("com.example.missing") == true
                    && e?.detail.contains("com.example.echo") == true
            }
        }
    }

    @Test func handlersRunOnTheChosenQueueWithNoHostLockHeld() async throws {
        try await withHost { host, _ in
            let ext = try host.extension(identifier: "com.example.echo")
            let key = DispatchSpecificKey<String>()
            let queue = DispatchQueue(label: "app.callbacks")
            queue.setSpecific(key: key, value: "app")
            ext.callbackQueue = queue
            let seen = Mutex<(String?, [ExtensionItem])?>(nil)
            ext.requestCompletionHandler = { [weak ext] id, items in
                // Calling back into the host from a handler must not deadlock.
                _ = ext?.pid(for: id)
                ext?.cancelRequest(id)
                seen.withLock { $0 = (DispatchQueue.getSpecific(key: key), items) }
            }
            let input = [ExtensionItem(title: "t", attachments: ["a", .data([1, 2])], userInfo: ["n": 1, "f": 0.5])]
            ext.beginRequest(withInputItems: input)
            #expect(await eventually { seen.withLock { $0 } != nil })
            #expect(seen.withLock { $0?.0 } == "app")
            #expect(seen.withLock { $0?.1 } == input)
        }
    }

    @Test func handlersCanRunOnTheHostLoopExactlyOnce() async throws {
        try await withHost { host, _ in
            let ext = try host.extension(identifier: "com.example.echo")
            ext.callsHandlersOnHostLoop = true
            let threads = Mutex<[String]>([])
            ext.requestCompletionHandler = { _, _ in
                let name = readSmallFile("/proc/thread-self/comm") ?? ""
                threads.withLock { $0.append(String(name.filter { $0 != "\n" })) }
            }
            for i in 0..<50 { ext.beginRequest(withInputItems: [ExtensionItem(title: "\(i)")]) }
            #expect(await eventually { threads.withLock { $0.count } == 50 })
            try await Task.sleep(nanoseconds: 200_000_000)
            #expect(threads.withLock { $0.count } == 50)
            #expect(threads.withLock { $0 }.allSatisfy { $0 == EventLoop.threadName })
        }
    }

    /// beginRequest and cancelRequest write to a warm worker's socket from the caller's thread when the loop is
    /// asleep; a request that ends there and then (cancelled, or too large to send) must still not run its handler
    /// inside the caller's call, even with handlers on the host loop.
    @Test func noHandlerRunsInsideTheCallThatEndedItsRequest() async throws {
        try await withHost { host, _ in
            let ext = try host.extension(identifier: "com.example.crasher")
            ext.callsHandlersOnHostLoop = true
            let handlerThreads = Mutex<[RequestID: UInt]>([:])
            ext.requestCancellationHandler = { id, _ in handlerThreads.withLock { $0[id] = UInt(pthread_self()) } }
            ext.requestInterruptionHandler = { id, _ in handlerThreads.withLock { $0[id] = UInt(pthread_self()) } }
            let (running, assigned) = beginNotingPid(ext, "slow:60000", deadline: 120)
            #expect(await eventually { assigned.pid != 0 })
            try await Task.sleep(nanoseconds: 50_000_000)  // the loop goes back to sleep
            let callerThread = UInt(pthread_self())
            let tooLarge = ext.beginRequest(withInputItems: [ExtensionItem(attachments: [.data([UInt8](repeating: 1, count: 17 << 20))])])
            try await Task.sleep(nanoseconds: 50_000_000)
            ext.cancelRequest(running)
            #expect(await eventually { handlerThreads.withLock { $0.count } == 2 })
            let threads = handlerThreads.withLock { $0 }
            #expect(threads[running] != nil && threads[running] != callerThread)
            #expect(threads[tooLarge] != nil && threads[tooLarge] != callerThread)
        }
    }

    @Test func pidIsTheLiveWorkerWhileInFlightAndNilAfter() async throws {
        try await withHost { host, _ in
            let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
            let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:300")])
            #expect(await eventually { ext.pid(for: id) != nil })
            let pid = try #require(ext.pid(for: id))
            // The pid is the worker's process from the moment its launcher names it, which may be just before that
            // process has finished exec'ing Crasher (a loaded run saw the launcher's image there): the same process
            // must become Crasher.
            #expect(await eventually { readLink("/proc/\(pid)/exe")?.hasSuffix("/Crasher") == true })
            #expect(ext.pid(for: id) == pid, "one pid for the request while it runs")
            #expect(await recorder.wait(for: id) == .completed([ExtensionItem(title: "slow:300")]))
            #expect(ext.pid(for: id) == nil)
            #expect(ext.pid(for: RequestID()) == nil)
        }
    }

    @Test func liveWorkerIsReusedAndRequestsRunConcurrently() async throws {
        try await withHost { host, _ in
            let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
            let ids = (0..<8).map { _ in ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:3000")]) }
            // All eight run at once on one worker (Crasher's MaxConcurrentRequests is 8).
            var peak = 0
            for _ in 0..<1000 where peak < 8 {
                let (_, _, workers) = await host.inspect()
                peak = max(peak, workers.map(\.inFlight).max() ?? 0)
                #expect(workers.count <= 1)
                try await Task.sleep(nanoseconds: 5_000_000)
            }
            #expect(peak == 8)
            let outcomes = await recorder.wait(for: ids)
            #expect(ids.allSatisfy { outcomes?[$0] == .completed([ExtensionItem(title: "slow:3000")]) })
            let (stats, _, workers) = await host.inspect()
            #expect(stats.spawns == 1)
            #expect(workers.count == 1)
        }
    }

    @Test func requestsBeyondCapacityQueueAndAllComplete() async throws {
        let temp = TemporaryExtension(identifier: "com.example.narrow", executable: "Crasher",
                                      policy: "<key>MaxConcurrentRequests</key><integer>1</integer><key>MaxWorkers</key><integer>2</integer>")
        defer { temp.remove() }
        try await withHost(extraSearchPaths: [temp.root]) { host, _ in
            let ext = try host.extension(identifier: temp.identifier)
            let recorder = Recorder()
            recorder.attach(to: ext)
            let ids = (0..<10).map { i in ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:\(i * 3)")]) }
            let outcomes = await recorder.wait(for: ids)
            #expect(ids.allSatisfy { if case .completed = outcomes?[$0] { true } else { false } })
            let (stats, _, workers) = await host.inspect()
            #expect(stats.spawns == 2, "never more workers than MaxWorkers")
            #expect(workers.count <= 2)
        }
    }

    @Test func perRequestDeadlineOverridesTheManifest() async throws {
        try await withHost { host, _ in
            let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
            let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:5000")], deadline: 0.2)
            #expect(await recorder.wait(for: id) == .interrupted(.timedOut))
        }
    }

    /// The manifest's RequestDeadlineSeconds is a limit a request's own deadline cannot lift: before, an app's
    /// deadline (the CLI sends 60 s) replaced it, and a 0.5 s limit let a 5 s request complete.
    @Test func theManifestsDeadlineIsALimitARequestCannotLift() async throws {
        // A 2 s limit: the requests that outlast it sleep 60 s; the one within it meets a warm worker.
        let limited = TemporaryExtension(identifier: "com.example.limited", executable: "Crasher",
                                         policy: "<key>RequestDeadlineSeconds</key><real>2</real><key>MaxWorkers</key><integer>1</integer>")
        defer { limited.remove() }
        try await withHost(extraSearchPaths: [limited.root]) { host, _ in
            let (ext, recorder) = try recordedExtension(host, "com.example.limited")
            _ = try await ext.prewarm()
            let later = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:60000")], deadline: 120)
            #expect(await recorder.wait(for: later) == .interrupted(.timedOut))
            let unset = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:60000")])
            #expect(await recorder.wait(for: unset) == .interrupted(.timedOut))
            // Within the limit, a request completes.
            let quick = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:1")], deadline: 120)
            #expect(await recorder.wait(for: quick) == .completed([ExtensionItem(title: "slow:1")]))
        }
    }

    @Test func aDeadlineCancelsOnlyItsOwnRequestNotTheWorkersOthers() async throws {
        // One worker, two requests on it. The first slice killed the worker at a deadline, so the neighbour
        // ended as `hang`; now the late request is cancelled at the worker and only it ends (`timedOut`).
        let single = TemporaryExtension(identifier: "com.example.single", executable: "Crasher",
                                        policy: "<key>MaxWorkers</key><integer>1</integer>")
        defer { single.remove() }
        try await withHost(extraSearchPaths: [single.root]) { host, _ in
            let (ext, recorder) = try recordedExtension(host, "com.example.single")
            let (neighbour, neighbourPid) = beginNotingPid(ext, "slow:1500")
            #expect(await eventually { neighbourPid.pid != 0 })
            let late = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:30000")], deadline: 0.3)
            #expect(await recorder.wait(for: late) == .interrupted(.timedOut))
            #expect(await recorder.wait(for: neighbour) == .completed([ExtensionItem(title: "slow:1500")]))
            #expect(processIsAlive(neighbourPid.pid), "the worker was not killed")
            let (stats, _, _) = await host.inspect()
            #expect(stats.hangKills == 0)
        }
    }

    /// The host hands its busy-poll budget to each worker, and a worker with nothing to do polls once for it and
    /// then sleeps. A budget outside 0...1000 µs is a configuration error.
    @Test func busyPollReachesWorkersAndAnIdleWorkerSleeps() async throws {
        try await withHost({
            $0.busyPollMicroseconds = 1000
            $0.heartbeatInterval = .seconds(30)  // no pings in the measured second
            $0.heartbeatTimeout = .seconds(60)
        }) { host, _ in
            let (ext, recorder) = try recordedExtension(host, "com.example.echo")
            let (id, assigned) = beginNotingPid(ext, "poll")
            #expect(await recorder.wait(for: id) == .completed([ExtensionItem(title: "poll")]))
            let pid = assigned.pid
            let environment = try #require(readSmallFile("/proc/\(pid)/environ"))
            #expect(environment.split(separator: "\0").contains("SDKHOST_BUSY_POLL_US=1000"))
            func cpu() -> UInt64? {
                readSmallFile("/proc/\(pid)/schedstat")?.split(separator: " ").first.flatMap { UInt64($0) }
            }
            usleep(100_000)  // past its last poll
            let before = try #require(cpu())
            usleep(1_000_000)
            let after = try #require(cpu())
            #expect(after - before < 100_000_000, "the idle worker ran \((after - before) / 1000) us in 1 s")
        }
        var configuration = HostConfiguration(extensionSearchPaths: ["\(packageRoot)/Extensions"])
        configuration.busyPollMicroseconds = 1001
        #expect {
            _ = try ExtensionHost(configuration: configuration)
        } throws: { error in
            let e = error as? HostError
            return e?.code == .invalidConfiguration && e?.detail.contains("busyPollMicroseconds: BusyPollMicroseconds: 1001 is outside 0...1000") == true
        }
    }

    @Test func idleWorkerIsRetiredWithoutACrashReport() async throws {
        let temp = TemporaryExtension(identifier: "com.example.brief", executable: "Echo",
                                      policy: "<key>IdleTimeoutSeconds</key><real>0.3</real>")
        defer { temp.remove() }
        try await withHost(extraSearchPaths: [temp.root]) { host, _ in
            let ext = try host.extension(identifier: temp.identifier)
            let recorder = Recorder()
            recorder.attach(to: ext)
            let pidBox = Mutex<pid_t?>(nil)
            let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "x")], deadline: nil,
                                      onWorkerAssigned: { p in pidBox.withLock { $0 = p } })
            #expect(await recorder.wait(for: id) == .completed([ExtensionItem(title: "x")]))
            let pid = try #require(pidBox.withLock { $0 })
            #expect(await eventually(timeout: 20) { !processIsAlive(pid) }, "idle worker exits after its timeout")
            #expect(await eventually(timeout: 20) { ResourceSnapshot.take().workerChildren.isEmpty })
            // The host lists the worker until its loop has seen the exit: the process may be gone (or a zombie,
            // which the snapshot does not count) a moment before, most of all on a loaded machine.
            #expect(await eventually(timeout: 20) { await host.inspect().2.isEmpty }, "the retired worker is no longer listed")
            #expect(await host.inspect().1.isEmpty, "retired, not crashed")
            // And a later request starts a new worker.
            let again = ext.beginRequest(withInputItems: [ExtensionItem(title: "y")])
            #expect(await recorder.wait(for: again) == .completed([ExtensionItem(title: "y")]))
        }
    }

    @Test func performReturnsItemsAndThrowsTypedFailures() async throws {
        try await withHost { host, _ in
            let ext = try host.extension(identifier: "com.example.crasher")
            #expect(try await ext.perform([ExtensionItem(title: "echo")]) == [ExtensionItem(title: "echo")])
            await #expect(throws: RequestFailure.interrupted(.signal(SIGSEGV))) {
                try await ext.perform([ExtensionItem(title: "segv")])
            }
            await #expect {
                try await ext.perform([ExtensionItem(title: "cancel")])
            } throws: { error in
                if case .cancelled(let e) = error as? RequestFailure { return e.code == 42 }
                return false
            }
        }
    }

    @Test func cancellingThePerformingTaskCancelsAtTheWorker() async throws {
        try await withHost { host, _ in
            let ext = try host.extension(identifier: "com.example.crasher")
            let task = Task { try await ext.perform([ExtensionItem(title: "slow:20000")]) }
            try await Task.sleep(nanoseconds: 300_000_000)
            task.cancel()
            let start = monotonicMs()
            await #expect(throws: CancellationError.self) { try await task.value }
            #expect(monotonicMs() - start < 5000, "cancellation does not wait for the 20 s request")
            // The worker honoured the cancel (slow:N checks isCancelled), so it was not killed.
            try await Task.sleep(nanoseconds: 500_000_000)
            let (stats, crashes, workers) = await host.inspect()
            #expect(crashes.isEmpty)
            #expect(workers.first?.inFlight == 0, "the worker acknowledged the cancel and freed its slot")
            #expect(stats.cancellations == 1)
        }
    }

    @Test func alreadyCancelledTaskNeverLeavesARequestRunning() async throws {
        try await withHost { host, _ in
            let ext = try host.extension(identifier: "com.example.crasher")
            let task = Task {
                withUnsafeCurrentTask { $0?.cancel() }
                return try await ext.perform([ExtensionItem(title: "slow:20000")])
            }
            await #expect(throws: CancellationError.self) { try await task.value }
            try await Task.sleep(nanoseconds: 300_000_000)
            let (_, _, workers) = await host.inspect()
            #expect(workers.allSatisfy { $0.inFlight == 0 })
        }
    }

    @Test func droppingTheHostWithoutShutdownStopsWorkersAndInterrupts() async throws {
        // An app that just lets go of its host: workers must still be killed and reaped, in-flight requests
        // interrupted, and nothing may touch the engine after it is gone.
        await warmUpOnce()
        let baseline = ResourceSnapshot.take()
        let recorder = Recorder()
        weak var weakEngine: HostEngine?
        var ids: [RequestID] = []
        do {
            let (host, _) = try makeHost()
            weakEngine = host.engine
            let ext = try host.extension(identifier: "com.example.crasher")
            recorder.attach(to: ext)
            ids = (0..<3).map { _ in ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:30000")], deadline: 120) }
            #expect(await eventually { ids.allSatisfy { ext.pid(for: $0) != nil } })
        }
        let outcomes = await recorder.wait(for: ids)
        #expect(ids.allSatisfy { outcomes?[$0] == .interrupted(.hostShutdown) })
        #expect(await eventually(timeout: 20) { weakEngine == nil }, "the engine is released once stopped")
        let leak = await leaksSince(baseline)
        #expect(leak == nil, "\(leak ?? "")")
    }

    @Test func asyncHandlerCompletesAndHonoursTaskCancellation() async throws {
        try await withHost { host, _ in
            let ext = try host.extension(identifier: "com.example.async-echo")
            #expect(try await ext.perform([ExtensionItem(title: "hi")]) == [ExtensionItem(title: "hi")])
            let recorder = Recorder()
            recorder.attach(to: ext)
            // A host cancel cancels the handler's Task; the runtime then acknowledges, so no kill is needed.
            let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "sleep:30000")], deadline: 120)
            #expect(await eventually { ext.pid(for: id) != nil })
            ext.cancelRequest(id)
            #expect(await recorder.wait(for: id) == .cancelled(.cancelledByHost))
            #expect(await eventually { await host.inspect().2.first?.inFlight == 0 },
                    "the worker acknowledged the cancel and freed its slot")
            // A handler that returns without finishing is reported, not left hanging.
            let forgot = ext.beginRequest(withInputItems: [ExtensionItem(title: "forget")])
            let outcome = await recorder.wait(for: forgot)
            guard case .cancelled(let error)? = outcome else {
                Issue.record("expected a cancellation, got \(String(describing: outcome))")
                return
            }
            #expect(error.domain == "SDKExtension" && error.code == 2)
            let (_, crashes, _) = await host.inspect()
            #expect(crashes.isEmpty)
        }
    }

    @Test func memoryLimitStopsAWorkerThatGrowsPastIt() async throws {
        let temp = TemporaryExtension(identifier: "com.example.small", executable: "Crasher",
                                      policy: "<key>MemoryLimitMB</key><integer>128</integer>")
        defer { temp.remove() }
        try await withHost(extraSearchPaths: [temp.root]) { host, _ in
            let ext = try host.extension(identifier: temp.identifier)
            let recorder = Recorder()
            recorder.attach(to: ext)
            let small = ext.beginRequest(withInputItems: [ExtensionItem(title: "alloc:16")])
            #expect(await recorder.wait(for: small) == .completed([ExtensionItem(title: "allocated 16 MB")]))
            let big = ext.beginRequest(withInputItems: [ExtensionItem(title: "alloc:1024")])
            let outcome = await recorder.wait(for: big)
            guard case .interrupted(.signal)? = outcome else {
                Issue.record("expected the worker to die at its memory limit, got \(String(describing: outcome))")
                return
            }
        }
    }

    @Test func extensionAndHostAreReleased() async throws {
        weak var weakExtension: Extension?
        weak var weakEngine: HostEngine?
        try await withHost { host, _ in
            let ext = try host.extension(identifier: "com.example.echo")
            weakExtension = ext
            weakEngine = host.engine
            #expect(try await ext.perform([ExtensionItem(title: "x")]).count == 1)
        }
        #expect(await eventually(timeout: 10) { weakExtension == nil && weakEngine == nil })
    }
}

func monotonicMs() -> Double { Double(monotonicNanoseconds()) / 1e6 }
