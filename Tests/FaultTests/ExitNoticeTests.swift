// Exit notices (SDKPosix/ExitNotice.swift): a killed worker's requests end when the kernel walks its robust-futex
// list, before its memory is torn down; and a worker that forges or floods its own notice page changes nothing
// but how its death will be seen.
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension FaultTests {
    @Suite(.serialized) struct ExitNotices {
        /// One Crasher worker that has touched 64 MiB: its teardown takes milliseconds, so the notice, which comes
        /// before the teardown, ends its requests first even on a loaded machine.
        static func withFatWorker(policy: String = "",
                                  _ body: (ExtensionHost, Extension, Recorder, LogCapture) async throws -> Void) async throws {
            let temp = TemporaryExtension(identifier: "com.example.fat", executable: "Crasher", policy: """
                <key>MaxWorkers</key><integer>1</integer>\(policy)
                """)
            defer { temp.remove() }
            // Heartbeats are not under test: a loaded machine may keep a worker that is touching 64 MiB from
            // answering for a few seconds.
            try await withHost(extraSearchPaths: [temp.root], {
                $0.logLevel = .debug
                $0.heartbeatTimeout = .seconds(60)
            }) { host, log in
                let (ext, recorder) = try recordedExtension(host, "com.example.fat")
                let fat = ext.beginRequest(withInputItems: [ExtensionItem(title: "leak:64")], deadline: 60)
                let leaked = await recorder.wait(for: fat)
                #expect(leaked == .completed([ExtensionItem(title: "leaked 64 MB")]),
                        "\(String(describing: leaked)); \(log.all.suffix(8).joined(separator: " | "))")
                try await body(host, ext, recorder, log)
            }
        }

        @Test func aKilledWorkersRequestsEndOnItsExitNoticeAndItIsStillReaped() async throws {
            try await Self.withFatWorker { host, ext, recorder, log in
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:60000")], deadline: 120)
                #expect(await eventually { ext.pid(for: id) != nil })
                let pid = try #require(ext.pid(for: id))
                #expect(ExitNoticeWatcher.shared.watchedCount >= 1)
                kill(pid, SIGKILL)
                #expect(await recorder.wait(for: id) == .interrupted(.signal(SIGKILL)))
                #expect(log.contains("pid \(pid) is exiting (signal 9 (SIGKILL)): its requests end now"),
                        "the request did not end on the exit notice")
                // Reaped all the same (withHost checks that no worker child is left), and the crash recorded once.
                #expect(await eventually { log.contains("pid \(pid) reaped (signal 9 (SIGKILL))") })
                let reports = await host.crashReports().filter { $0.pid == pid }
                #expect(reports.count == 1)
                #expect(reports.first?.reason == .signal(SIGKILL))
                #expect(recorder.callbacks(id).count == 1)
                let next = ext.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
                #expect(await recorder.wait(for: next) == .completed([ExtensionItem(title: "echo")]))
            }
        }

        /// Crashes the fat worker (segv) until its exit notice, not the reaper, ends the request; up to three fat
        /// workers. The request always ends with its own signal.
        static func crashUntilTheNoticeWins(_ ext: Extension, _ recorder: Recorder, _ log: LogCapture) async {
            for attempt in 1...3 {
                if attempt > 1 {
                    let fat = ext.beginRequest(withInputItems: [ExtensionItem(title: "leak:64")], deadline: 60)
                    #expect(await recorder.wait(for: fat) == .completed([ExtensionItem(title: "leaked 64 MB")]))
                }
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "segv")], deadline: 60)
                #expect(await recorder.wait(for: id) == .interrupted(.signal(SIGSEGV)))
                if log.contains("is exiting (signal 11 (SIGSEGV))") { break }
            }
            #expect(log.contains("is exiting (signal 11 (SIGSEGV))"), "\(log.all.joined(separator: "\n"))")
        }

        @Test func aCrashEndsOnTheNoticeWithItsOwnSignal() async throws {
            try await Self.withFatWorker { _, ext, recorder, log in
                // Always its own signal. Which path ends it is a race the notice usually wins; on a loaded machine
                // the reaper may win one, so up to three fat workers crash, and the notice must win at least once.
                await Self.crashUntilTheNoticeWins(ext, recorder, log)
            }
        }

        /// A worker's parent-death signal follows the thread that spawned it. A replacement started while the
        /// watcher's thread ran the engine (the notice of a crash) used to be spawned there, and was SIGKILLed when
        /// that thread ended, 5 s after it had nothing left to watch. Workers are spawned on the loop thread.
        @Test func aReplacementStartedOnACrashNoticeOutlivesTheWatchersThread() async throws {
            try await Self.withFatWorker(policy: "<key>MinWarmWorkers</key><integer>1</integer>") { host, ext, recorder, log in
                // The notice must win the race with the reaper, so that the replacement is started while the
                // watcher's thread runs the engine: a fat worker's teardown is slow; up to three tries.
                await Self.crashUntilTheNoticeWins(ext, recorder, log)
                // The replacement: it forges its notice, so the watcher has nothing left to watch and its thread
                // ends 5 s later (ExitNoticeWatcher.idleSeconds).
                let probe = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:200")])
                #expect(await eventually { ext.pid(for: probe) != nil })
                let replacement = try #require(ext.pid(for: probe))
                #expect(await recorder.wait(for: probe) == .completed([ExtensionItem(title: "slow:200")]))
                let forged = ext.beginRequest(withInputItems: [ExtensionItem(title: "notice-fake")])
                #expect(await recorder.wait(for: forged) == .completed([ExtensionItem(title: "notice-fake")]))
                #expect(await eventually { log.contains("pid \(replacement) changed its exit notice but is not exiting") })
                #expect(await eventually(timeout: 30) { ExitNoticeWatcher.shared.watchedCount == 0 })
                try await Task.sleep(nanoseconds: UInt64(ExitNoticeWatcher.idleSeconds + 3) * 1_000_000_000)
                #expect(kill(replacement, 0) == 0, "the replacement died: \(log.all.suffix(6).joined(separator: " | "))")
                #expect(await host.crashReports().filter { $0.pid == replacement }.isEmpty)
                let next = ext.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
                #expect(await recorder.wait(for: next) == .completed([ExtensionItem(title: "echo")]))
                #expect(log.contains("pid \(replacement) is exiting") == false)
            }
        }

        @Test func aForgedNoticeOnlyEndsTheWatch() async throws {
            try await withHost({ $0.logLevel = .debug }) { host, log in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                let first = ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:300")])
                #expect(await eventually { ext.pid(for: first) != nil })
                let pid = try #require(ext.pid(for: first))
                #expect(await recorder.wait(for: first) == .completed([ExtensionItem(title: "slow:300")]))
                let forged = ext.beginRequest(withInputItems: [ExtensionItem(title: "notice-fake")])
                #expect(await recorder.wait(for: forged) == .completed([ExtensionItem(title: "notice-fake")]))
                #expect(await eventually { log.contains("pid \(pid) changed its exit notice but is not exiting; no longer watched") })
                #expect(!log.contains("is exiting"))
                // The worker lives on (signal 0 only asks), nothing was recorded as a crash, and it still serves.
                #expect(kill(pid, 0) == 0)
                #expect(await host.crashReports().isEmpty)
                let next = ext.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
                #expect(await recorder.wait(for: next) == .completed([ExtensionItem(title: "echo")]))
                #expect(recorder.callbacks(forged).count == 1)
            }
        }

        @Test func wakingTheWatcherWithoutExitingEndsTheWatchNotTheHost() async throws {
            try await withHost({ $0.logLevel = .debug }) { host, log in
                let (ext, recorder) = try recordedExtension(host, "com.example.crasher")
                let flood = ext.beginRequest(withInputItems: [ExtensionItem(title: "notice-wake:2000")], deadline: 60)
                #expect(try await bystanderEcho(host, "meanwhile") == .completed([ExtensionItem(title: "meanwhile")]))
                #expect(await recorder.wait(for: flood) == .completed([ExtensionItem(title: "notice-wake:2000")]))
                #expect(log.contains("woke its exit notice \(ExitNoticeWatcher.spuriousWakeLimit) times without exiting"))
                #expect(recorder.callbacks(flood).count == 1)
                #expect(await host.crashReports().isEmpty)
            }
        }
    }
}
