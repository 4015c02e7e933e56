// Races and compound failures: cancel against completion, a crash with several requests in flight, a crash
// before the handshake, a missing executable, a worker that ignores cancel or stops answering heartbeats,
// shutdown with requests in flight, and 200 requests against workers killed at random.
import SDKWire
import HostTestSupport
import SDKHost
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension FaultTests {
    @Suite(.serialized) struct Races {
        @Test func cancelRacingCompletionEndsEachRequestOnce() async throws {
            try await withHost { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.echo")
                var ids: [RequestID] = []
                for i in 0..<300 {
                    let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "r\(i)")])
                    if i % 3 != 0 { ext.cancelRequest(id) }  // some cancels land before, some after completion
                    ids.append(id)
                }
                let outcomes = await recorder.wait(for: ids)
                #expect(outcomes != nil)
                try await Task.sleep(nanoseconds: 300_000_000)
                #expect(ids.allSatisfy { recorder.callbacks($0).count == 1 })
                #expect(recorder.total == ids.count)
                let kinds = Set((outcomes ?? [:]).values.map(kind))
                #expect(!kinds.contains("interrupted"))
                #expect(kinds.contains("cancelled"))
            }
        }

        @Test func crashWithThreeInFlightInterruptsOnlyThatWorker() async throws {
            // A copy of Crasher's manifest that allows three requests per worker, so the fourth needs a second worker.
            let temp = TemporaryExtension(identifier: "com.example.crasher3", executable: "Crasher",
                                          policy: "<key>MaxConcurrentRequests</key><integer>3</integer><key>MaxWorkers</key><integer>2</integer>")
            defer { temp.remove() }
            try await withHost(extraSearchPaths: [temp.root]) { host, _ in
                let ext = try host.extension(identifier: temp.identifier)
                let recorder = Recorder()
                recorder.attach(to: ext)
                // A worker that has finished its handshake: one killed before it would have its requests sent
                // again (no handler ran), which crashDuringHandshakeRequeuesWithTheItems covers.
                let ready = try await ext.prewarm()
                let victims = (0..<3).map { _ in ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:20000")], deadline: 60) }
                let bystander = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:1500")], deadline: 60)
                #expect(await eventually { (victims + [bystander]).allSatisfy { ext.pid(for: $0) != nil } })
                let victimPid = try #require(ext.pid(for: victims[0]))
                #expect(victimPid == ready)
                #expect(victims.allSatisfy { ext.pid(for: $0) == victimPid })
                #expect(ext.pid(for: bystander) != victimPid)
                kill(victimPid, SIGKILL)
                let outcomes = await recorder.wait(for: victims + [bystander])
                for id in victims { #expect(outcomes?[id] == .interrupted(.signal(SIGKILL))) }
                #expect(outcomes?[bystander] == .completed([ExtensionItem(title: "slow:1500")]))
                let (_, crashes, _) = await host.inspect()
                #expect(Set(crashes.first?.inFlightRequests ?? []) == Set(victims))
            }
        }

        @Test func aWorkerKilledBeforeItsHandshakeHasItsRequestsSentAgainWithTheirItems() async throws {
            // The first slice of the requeue sent them again with no items: a request "slow:20000" came back
            // completed at once with nothing.
            try await withHost({ $0.workerEnvironment = ["CRASHER_FAULT_AT_START=sleep:400"] }) { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                let begun = (0..<3).map { n in beginNotingPid(ext, "slow:\(n * 10)") }
                #expect(await eventually { begun.allSatisfy { $0.1.pid != 0 } })
                kill(begun[0].1.pid, SIGKILL)  // asleep before its handshake
                let outcomes = try #require(await recorder.wait(for: begun.map(\.0)))
                for (n, (id, _)) in begun.enumerated() {
                    #expect(outcomes[id] == .completed([ExtensionItem(title: "slow:\(n * 10)")]))
                    #expect(recorder.callbacks(id).count == 1)
                }
            }
        }

        @Test func crashDuringHandshakeInterrupts() async throws {
            try await withHost({ $0.workerEnvironment = ["CRASHER_FAULT_AT_START=abort"] }) { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
                #expect(await recorder.wait(for: id) == .interrupted(.signal(SIGABRT)))
            }
        }

        @Test func missingExecutableIsAClearErrorAndNeverHangs() async throws {
            let temp = TemporaryExtension(identifier: "com.example.ghost", executable: "NoSuchWorker")
            defer { temp.remove() }
            try await withHost(extraSearchPaths: [temp.root]) { host, _ in
                #expect {
                    _ = try host.extension(identifier: "com.example.ghost")
                } throws: { error in
                    let e = error as? HostError
                    return e?.code == .executableNotFound && e?.detail.contains("NoSuchWorker") == true
                        && e?.detail.contains("com.example.ghost") == true
                }
            }
        }

        @Test func executableRemovedAfterLookupInterruptsWithLaunchFailure() async throws {
            // Copy Echo under a name of its own into a private folder, look the extension up, delete the binary.
            let temp = TemporaryExtension(identifier: "com.example.vanishing", executable: "VanishingEcho")
            defer { temp.remove() }
            let copy = "\(temp.root)/Ext/VanishingEcho"
            let echo = try #require(currentExecutableDirectory()) + "/Echo"
            #expect(system2("cp", echo, copy) == 0)
            try await withHost(extraSearchPaths: [temp.root]) { host, _ in
                let ext = try host.extension(identifier: "com.example.vanishing")
                unlink(copy)
                let recorder = Recorder()
                recorder.attach(to: ext)
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "x")])
                let outcome = await recorder.wait(for: id, timeout: 10)
                guard case .interrupted(.launchFailed(let detail))? = outcome else {
                    Issue.record("expected launchFailed, got \(String(describing: outcome))")
                    return
                }
                #expect(detail.contains(copy))
                // Other extensions are unaffected.
                #expect(try await bystanderEcho(host, "fine") == .completed([ExtensionItem(title: "fine")]))
            }
        }

        /// A 200 MiB reply, past the frame limit, ends cancelled and its worker goes on serving, with heartbeats
        /// every 50 ms throughout. (The unit test HostConnectionTests pins what made this fail under load: the
        /// reply was encoded under the lock the reader needs for its pongs.)
        @Test func aHugeReplyEndsCancelledWhileItsWorkerKeepsAnsweringHeartbeats() async throws {
            let roomy = TemporaryExtension(identifier: "com.example.crasher-roomy", executable: "Crasher", policy: """
                <key>MemoryLimitMB</key><integer>3072</integer>
                """)
            defer { roomy.remove() }
            try await withHost(extraSearchPaths: [roomy.root], {
                $0.heartbeatInterval = .milliseconds(50)
                $0.heartbeatTimeout = .seconds(5)
            }) { host, log in
                let (ext, recorder) = try recordedExtension(host, roomy.identifier)
                let big = ext.beginRequest(withInputItems: [ExtensionItem(title: "bigreply:200")], deadline: .seconds(120))
                let outcome = await recorder.wait(for: big, timeout: 120)
                guard case .cancelled(let error)? = outcome else {
                    let tail = log.all.suffix(4).joined(separator: " | ")
                    Issue.record("expected the oversized reply's cancellation, got \(String(describing: outcome)); \(tail)")
                    return
                }
                #expect(error.message.contains("reply too large"))
                let after = ext.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
                #expect(await recorder.wait(for: after) == .completed([ExtensionItem(title: "echo")]))
            }
        }

        @Test func oversizedMessagesEndTheirRequestClearlyAndHarmNothingElse() async throws {
            try await withHost { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                // Input over the 16 MiB frame limit: never sent, interrupted with the reason.
                let huge = ExtensionItem(attachments: [.data([UInt8](repeating: 1, count: 17 << 20))])
                // Long deadlines (Crasher's limit is 120 s): building and refusing 17 MiB is slow on a loaded machine.
                let tooBig = ext.beginRequest(withInputItems: [ExtensionItem(title: "echo"), huge], deadline: .seconds(120))
                let inputOutcome = await recorder.wait(for: tooBig)
                guard case .interrupted(.protocolViolation(let detail))? = inputOutcome else {
                    Issue.record("expected an interruption for an oversized request, got \(String(describing: inputOutcome))")
                    return
                }
                #expect(detail.contains("request too large") && detail.contains("16777216"), "\(detail)")
                // Input nested past the frame's 512 levels: never sent either. Before, the worker got a frame it
                // must refuse, exited 2, and that was recorded as the extension's crash.
                var deep = PlistValue.array([])
                for _ in 0..<520 { deep = .array([deep]) }
                let tooDeep = ext.beginRequest(withInputItems: [ExtensionItem(title: "echo", attachments: [deep])], deadline: .seconds(120))
                let deepOutcome = await recorder.wait(for: tooDeep)
                guard case .interrupted(.protocolViolation(let deepDetail))? = deepOutcome else {
                    Issue.record("expected an interruption for a request nested too deep, got \(String(describing: deepOutcome))")
                    return
                }
                #expect(deepDetail.contains("request cannot be encoded") && deepDetail.contains("deeper than the limit of 512"), "\(deepDetail)")
                // A reply over the limit: the worker reports it instead of leaving the request hanging.
                let bigReply = ext.beginRequest(withInputItems: [ExtensionItem(title: "bigreply:17")], deadline: .seconds(120))
                let replyOutcome = await recorder.wait(for: bigReply)
                guard case .cancelled(let error)? = replyOutcome else {
                    Issue.record("expected a cancellation for an oversized reply, got \(String(describing: replyOutcome))")
                    return
                }
                #expect(error.domain == "SDKExtension" && error.code == 3 && error.message.contains("reply too large"))
                // Nothing else was affected: same worker, still serving.
                let after = ext.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
                #expect(await recorder.wait(for: after) == .completed([ExtensionItem(title: "echo")]))
                let (_, crashes, _) = await host.inspect()
                #expect(crashes.isEmpty)
            }
        }

        @Test func ignoredCancelIsKilledAfterGracePeriod() async throws {
            try await withHost({ $0.cancelGracePeriod = .seconds(0.3) }) { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "hang")], deadline: 120)
                #expect(await eventually { ext.pid(for: id) != nil })
                let pid = try #require(ext.pid(for: id))
                ext.cancelRequest(id)
                #expect(await recorder.wait(for: id) == .cancelled(.cancelledByHost))
                #expect(await eventually(timeout: 20) { !processIsAlive(pid) }, "the worker ignoring the cancel is killed")
                // Dead is not yet reaped: wait for the host to record it.
                var crashes: [CrashReport] = []
                var stats = StatusTotals(adding: [])
                for _ in 0..<400 where crashes.isEmpty {
                    (stats, crashes, _) = await host.inspect()
                    try await Task.sleep(nanoseconds: 5_000_000)
                }
                #expect(crashes.first?.reason == .hang)
                #expect(crashes.first?.pid == pid)
                #expect(stats.hangKills == 1)
                try await Task.sleep(nanoseconds: 200_000_000)
                #expect(recorder.callbacks(id).count == 1, "the kill after the cancel adds no second callback")
            }
        }

        @Test func stoppedWorkerMissesHeartbeatsAndIsKilled() async throws {
            try await withHost({
                $0.heartbeatInterval = .seconds(0.1)
                $0.heartbeatTimeout = .seconds(0.5)
            }) { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:30000")], deadline: 120)
                #expect(await eventually { ext.pid(for: id) != nil })
                let pid = try #require(ext.pid(for: id))
                kill(pid, SIGSTOP)  // a wedged process: alive, but answers nothing
                #expect(await recorder.wait(for: id, timeout: 30) == .interrupted(.hang))
                // The interruption may come before the kernel has torn the killed worker down.
                #expect(await eventually(timeout: 20) { !processIsAlive(pid) })
            }
        }

        @Test func shutdownInterruptsInFlightAndReapsWorkers() async throws {
            try await withHost { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                let ids = (0..<4).map { _ in ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:30000")], deadline: 120) }
                #expect(await eventually { ids.allSatisfy { ext.pid(for: $0) != nil } })
                await host.shutdown()
                let outcomes = await recorder.wait(for: ids)
                #expect(ids.allSatisfy { outcomes?[$0] == .interrupted(.hostShutdown) })
                // A request after shutdown is interrupted at once, never queued forever.
                let late = ext.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
                #expect(await recorder.wait(for: late, timeout: 10) == .interrupted(.hostShutdown))
            }
        }

        @Test func twoHundredRequestsWithWorkersKilledAtRandom() async throws {
            // About 20 kills in half a second would quarantine the extension (5 deaths in 10 s); this test is
            // about exactly-once delivery under kills, so the restart limit is out of its way.
            try await withHost({ $0.defaultPolicy.restartLimitBurst = 1000 }) { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                var g = SystemRandomNumberGenerator()
                var ids: [RequestID] = []
                var kills = 0
                for i in 0..<200 {
                    let input = i % 4 == 0 ? "echo" : "slow:\(Int.random(in: 1...30, using: &g))"
                    ids.append(ext.beginRequest(withInputItems: [ExtensionItem(title: input)], deadline: 60))
                    if i % 10 == 5 {
                        try await Task.sleep(nanoseconds: UInt64.random(in: 1_000_000...15_000_000, using: &g))
                        let (_, _, workers) = await host.inspect()
                        if let victim = workers.randomElement(using: &g) {
                            kill(victim.pid, SIGKILL)
                            kills += 1
                        }
                    }
                }
                let outcomes = await recorder.wait(for: ids, timeout: 120)
                #expect(outcomes != nil, "every request ended")
                try await Task.sleep(nanoseconds: 300_000_000)
                #expect(ids.allSatisfy { recorder.callbacks($0).count == 1 }, "exactly one callback each")
                let values = Array((outcomes ?? [:]).values)
                let completed = values.filter { kind($0) == "completed" }.count
                let killed = values.filter { $0 == .interrupted(.signal(SIGKILL)) }.count
                #expect(completed + killed == ids.count, "only completions and SIGKILL interruptions")
                #expect(completed > 0)
                #expect(kills > 0)
            }
        }
    }
}

/// Runs a program and waits for it; returns its exit status (tests only).
func system2(_ arguments: String...) -> Int32 {
    var pid: pid_t = 0
    let argv = arguments.map { strdup($0) } + [nil]
    defer { for p in argv { free(p) } }
    guard posix_spawnp(&pid, arguments[0], nil, nil, argv, environ) == 0 else { return -1 }
    var status: Int32 = 0
    waitpid(pid, &status, 0)
    return (status >> 8) & 0xFF
}
