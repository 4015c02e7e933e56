// Streaming partial results (context.send) and descriptor attachments (SCM_RIGHTS) in an embedded host, with
// real workers: order against the one terminal callback under a crash, a kill and a cancel mid-stream;
// backpressure against a worker that streams faster than the app reads; a worker that ignores its credit or
// passes a pipe; and no descriptor left open anywhere (`withHost` counts the test process's, Crasher reports its
// own).
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
import CSDKShim
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension FaultTests {
    @Suite(.serialized) struct Streaming {
        static func index(_ batch: [ExtensionItem]) -> Int64? { batch.first?.userInfo["index"]?.integerValue }
        static func madeAt(_ batch: [ExtensionItem]) -> UInt64 { UInt64(batch.first?.userInfo["madeAtNs"]?.integerValue ?? 0) }

        /// The partial results' indexes and the final items, counted in plain variables of the main actor: the
        /// closure is not `@Sendable`, and runs there (on Linux the main actor is a serial queue, not one thread,
        /// so the runtime's own check says so).
        @MainActor static func countOnMainActor(_ ext: Extension, _ text: String) async throws -> ([Int64], [ExtensionItem]) {
            var ticks: [Int64] = []
            let final = try await ext.perform([ExtensionItem(text: text)]) { batch in
                MainActor.assertIsolated("perform's progress closure runs in its caller's isolation")
                ticks.append(index(batch) ?? -1)
            }
            return (ticks, final)
        }

        @Test func aStreamYieldsEveryPartialResultInOrderThenTheCompletion() async throws {
            try await withHost { host, _ in
                let ticker = try host.extension(identifier: "com.example.ticker")
                var batches: [[ExtensionItem]] = []
                for try await batch in ticker.stream([ExtensionItem(text: "5:20")]) { batches.append(batch) }
                #expect(batches.count == 6)
                #expect(batches.prefix(5).map(Self.index) == [1, 2, 3, 4, 5])
                #expect(batches.last?.first?.title == "done")

                // perform(progress:): every call has returned before perform does.
                let seen = Mutex<[Int64]>([])
                let done = try await ticker.perform([ExtensionItem(text: "4:10")]) { batch in
                    seen.withLock { $0.append(Self.index(batch) ?? -1) }
                }
                #expect(seen.withLock { $0 } == [1, 2, 3, 4])
                #expect(done.first?.text == "4 ticks")

                // perform(onPartial:) from the main actor: a plain variable, no lock; the closure runs there.
                let (ticks, final) = try await Self.countOnMainActor(ticker, "3:10")
                #expect(ticks == [1, 2, 3])
                #expect(final.first?.text == "3 ticks")

                // beginRequest with a progress handler: the partial results, then exactly one completion.
                let timeline = Timeline()
                timeline.attach(to: ticker)
                let id = ticker.beginRequest(withInputItems: [ExtensionItem(text: "3:10")])
                #expect(await eventually(timeout: 60) { !timeline.outcomes(id).isEmpty })
                #expect(timeline.partials(id) == 3 && timeline.partialsPrecedeEnd(id))
                try await Task.sleep(nanoseconds: 200_000_000)
                #expect(timeline.outcomes(id).count == 1)

                // Bad input is the extension's clear cancellation, not a crash.
                await #expect(throws: RequestFailure.self) { try await ticker.perform([ExtensionItem(text: "many")]) }
            }
        }

        @Test func aWorkerThatStreamsFasterThanTheAppReadsIsSlowedDown() async throws {
            try await withHost { host, _ in
                let ticker = try host.extension(identifier: "com.example.ticker")
                var iterator = ticker.stream([ExtensionItem(text: "60:0")]).makeAsyncIterator()
                let first = try await iterator.next()
                #expect(first.flatMap(Self.index) == 1)
                // Having taken one, the app reads nothing for a second. The worker may run 16 ahead (2...17); it
                // makes the 18th and waits in `send` for the credit of the 2nd, which is only given once the app
                // takes it below; so the 19th is made after that.
                try await Task.sleep(nanoseconds: 1_000_000_000)
                let resumed = monotonicNanoseconds()
                var batches: [[ExtensionItem]] = []
                while let batch = try await iterator.next() { batches.append(batch) }
                #expect(batches.count == 60)  // 59 partial results and the completion
                let byIndex = Dictionary(batches.compactMap { b in Self.index(b).map { ($0, b) } }, uniquingKeysWith: { a, _ in a })
                let early = byIndex[17].map(Self.madeAt) ?? .max
                let late = byIndex[19].map(Self.madeAt) ?? 0
                #expect(early < resumed, "the first 17 were made while the app slept")
                #expect(late > resumed, "the 19th was made \(Int64(late) - Int64(resumed)) ns after the app resumed reading")
            }
        }

        @Test func aCrashMidStreamEndsWithTheInterruptionAfterThePartialResults() async throws {
            try await withHost { host, _ in
                let crasher = try host.extension(identifier: "com.example.crasher")
                var titles: [String] = []
                do {
                    for try await batch in crasher.stream([ExtensionItem(title: "stream-abort:5")]) {
                        titles.append(batch.first?.title ?? "?")
                    }
                    Issue.record("the stream ended without the interruption")
                } catch let failure as RequestFailure {
                    #expect(failure == .interrupted(.signal(SIGABRT)))
                }
                #expect(titles == (0..<5).map { "partial \($0)" })

                let timeline = Timeline()
                timeline.attach(to: crasher)
                let id = crasher.beginRequest(withInputItems: [ExtensionItem(title: "stream-abort:3")])
                #expect(await eventually(timeout: 60) { !timeline.outcomes(id).isEmpty })
                try await Task.sleep(nanoseconds: 200_000_000)
                #expect(timeline.outcomes(id) == [.interrupted(.signal(SIGABRT))])
                #expect(timeline.partials(id) == 3 && timeline.partialsPrecedeEnd(id))
            }
        }

        @Test func aKillOrACancelMidStreamEndsItOnceAndNothingFollows() async throws {
            try await withHost { host, _ in
                let ticker = try host.extension(identifier: "com.example.ticker")
                let timeline = Timeline()
                timeline.attach(to: ticker)

                let killed = ticker.beginRequest(withInputItems: [ExtensionItem(text: "1000:5")])
                #expect(await eventually(timeout: 60) { timeline.partials(killed) >= 3 })
                let pid = try #require(ticker.pid(for: killed))
                kill(pid, SIGKILL)
                #expect(await eventually(timeout: 60) { !timeline.outcomes(killed).isEmpty })

                let cancelled = ticker.beginRequest(withInputItems: [ExtensionItem(text: "1000:5")])
                #expect(await eventually(timeout: 60) { timeline.partials(cancelled) >= 2 })
                ticker.cancelRequest(cancelled)
                #expect(await eventually(timeout: 60) { !timeline.outcomes(cancelled).isEmpty })

                // Long enough for any partial result still on its way to have arrived, had it not been dropped.
                try await Task.sleep(nanoseconds: 300_000_000)
                #expect(timeline.outcomes(killed) == [.interrupted(.signal(SIGKILL))])
                #expect(timeline.outcomes(cancelled) == [.cancelled(.cancelledByHost)])
                #expect(timeline.partialsPrecedeEnd(killed) && timeline.partialsPrecedeEnd(cancelled))
            }
        }

        @Test func droppingAStreamCancelsItsRequest() async throws {
            try await withHost { host, _ in
                let ticker = try host.extension(identifier: "com.example.ticker")
                do {
                    var iterator = ticker.stream([ExtensionItem(text: "100000:1")]).makeAsyncIterator()
                    _ = try await iterator.next()
                    _ = try await iterator.next()
                }
                #expect(await eventually(timeout: 30) {
                    let (stats, _, _) = await host.inspect()
                    return stats.cancellations == 1
                })
                // cancel(): the stream, still held and read, ends with the cancellation (top-level code's way).
                let held = ticker.stream([ExtensionItem(text: "100000:1")])
                var taken = 0
                do {
                    for try await _ in held {
                        taken += 1
                        if taken == 2 { held.cancel() }
                    }
                    Issue.record("the stream ended without its cancellation")
                } catch RequestFailure.cancelled(let error) {
                    #expect(error == .cancelledByHost)
                }
                #expect(taken >= 2 && taken < 100000, "\(taken)")
                held.cancel()  // once ended: nothing happens
                let (stats, _, _) = await host.inspect()
                #expect(stats.cancellations == 2)
            }
        }

        @Test func aWorkerThatIgnoresItsCreditBreaksTheProtocol() async throws {
            try await withHost { host, _ in
                // The app reads slowly, so nothing is credited back before the 17th arrives.
                let crasher = try host.extension(identifier: "com.example.crasher")
                var taken = 0
                do {
                    for try await _ in crasher.stream([ExtensionItem(title: "flood")], deadline: .seconds(60)) {
                        taken += 1
                        try await Task.sleep(nanoseconds: 20_000_000)
                    }
                    Issue.record("the stream ended without an interruption")
                } catch RequestFailure.interrupted(.protocolViolation(let detail)) {
                    #expect(detail.contains("without credit"), "\(detail)")
                }
                #expect(taken <= streamWindow)
            }
        }

        // MARK: Descriptors

        @Test func fileAttachmentsRoundTripThroughAWorkerAndAreClosedAfterwards() async throws {
            let folder = try TemporaryFolder()
            let bytes = (0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
            try SDKHost.writeFile("\(folder.path)/input.bin", bytes, mode: 0o600)
            try await withHost { host, _ in
                let echo = try host.extension(identifier: "com.example.echo")
                let item = ExtensionItem(title: "files", attachments: [.data([1, 2, 3])], fileAttachments: [
                    try FileAttachment(contentsOf: "\(folder.path)/input.bin"),
                    try FileAttachment(bytes: Array("generated".utf8)),
                ])
                let back = try await echo.perform([item])
                #expect(back.count == 1 && back[0].attachments == [.data([1, 2, 3])])
                #expect(back[0].fileAttachments.count == 2)
                #expect(try back[0].fileAttachments.first?.readAll() == bytes)
                #expect(try back[0].fileAttachments.last?.readAll() == Array("generated".utf8))
                // A returned descriptor is read-only: the worker cannot hand back a way to change the app's file.
                try back[0].fileAttachments[0].save(to: "\(folder.path)/saved.bin")
                #expect(try readFile("\(folder.path)/saved.bin") == bytes)
            }
        }

        @Test func theWorkerKeepsNoDescriptorItWasGiven() async throws {
            let folder = try TemporaryFolder()
            try SDKHost.writeFile("\(folder.path)/f", [1, 2, 3], mode: 0o600)
            try await withHost { host, _ in
                let crasher = try host.extension(identifier: "com.example.crasher")
                func openCount(_ files: Int) async throws -> (Int, [PlistValue], String) {
                    let attachments = try (0..<files).map { _ in try FileAttachment(contentsOf: "\(folder.path)/f") }
                    let items = try await crasher.perform([ExtensionItem(title: "fd-count", fileAttachments: attachments)])
                    return (Int(items.first?.title ?? "") ?? -1, items.first?.attachments ?? [], items.first?.text ?? "")
                }
                // Twice first: the runtime's first requests may set up descriptors it keeps (Dispatch's).
                _ = try await openCount(0)
                let (before, _, beforeList) = try await openCount(0)
                let (during, sizes, duringList) = try await openCount(5)
                // Dispatch opens its timerfd the first time one of its timers is armed, which a loaded run has seen
                // happen between two of these requests: it is counted on neither side. Every other descriptor is.
                func dispatchTimers(_ list: String) -> Int {
                    list.split(separator: " ").filter { $0.hasSuffix("anon_inode:[timerfd]") }.count
                }
                #expect(before == beforeList.split(separator: " ").count && during == duringList.split(separator: " ").count)
                #expect(sizes == Array(repeating: .integer(3), count: 5))
                #expect(during - dispatchTimers(duringList) == before - dispatchTimers(beforeList) + 5,
                        "open while the request runs: \(duringList); before: \(beforeList)")
                #expect(duringList.split(separator: " ").filter { $0.hasSuffix("\(folder.path)/f") }.count == 5)
                // The context is released just after the reply; give it a moment.
                var afterList = ""
                #expect(await eventually(timeout: 10) {
                    guard let (count, _, list) = try? await openCount(0) else { return false }
                    afterList = list
                    return count - dispatchTimers(list) == before - dispatchTimers(beforeList)
                }, "after: \(afterList); before: \(beforeList)")
            }
        }

        @Test func aSandboxedWorkerReadsTheFileItWasGivenAndNothingMore() async throws {
            let folder = try TemporaryFolder()
            try SDKHost.writeFile("\(folder.path)/secret", Array("given".utf8), mode: 0o644)
            try await withHost { host, _ in
                let escaper = try host.extension(identifier: "com.example.escaper")
                func attempt(_ name: String, attach: Bool = true) async throws -> String {
                    let files = attach ? [try FileAttachment(contentsOf: "\(folder.path)/secret")] : []
                    return try await escaper.perform([ExtensionItem(title: name, fileAttachments: files)]).first?.title ?? "?"
                }
                #expect(try await attempt("fdread") == "allowed: read 5 bytes")
                #expect(try await attempt("fdwrite").hasPrefix("refused"))
                #expect(try await attempt("fdreopen").hasPrefix("refused"))
                // By its path, the same file is out of the worker's reach: the descriptor gave it that file only.
                #expect(try await attempt("read:\(folder.path)/secret", attach: false).hasPrefix("refused"))
                #expect(try readFile("\(folder.path)/secret") == Array("given".utf8))
            }
        }

        @Test func badDescriptorAttachmentsAreRefusedAndClosed() async throws {
            let folder = try TemporaryFolder()
            try SDKHost.writeFile("\(folder.path)/f", [9], mode: 0o600)
            #expect(throws: FileAttachmentError.self) { try FileAttachment(contentsOf: "\(folder.path)/missing") }
            do {
                _ = try FileAttachment(contentsOf: folder.path)
                Issue.record("a folder was accepted as an attachment")
            } catch {
                #expect(error.description.contains("a directory") && error.description.contains(folder.path))
            }
            // A writable descriptor becomes a read-only attachment.
            let writable = open("\(folder.path)/f", O_RDWR | O_CLOEXEC)
            #expect(writable >= 0)
            let attachment = try FileAttachment(duplicating: writable)
            close(writable)
            var byte: UInt8 = 0
            #expect(attachment.withUnsafeFileDescriptor { pwrite($0, &byte, 1, 0) } == -1 && errno == EBADF)
            #expect(try attachment.readAll() == [9])
            // An unsealed memfd becomes a sealed copy of what it held: its owner's later writes do not show.
            let memfd = sdk_memfd("test")
            #expect(write(memfd, "abc", 3) == 3)
            let snapshot = try FileAttachment(duplicating: memfd)
            #expect(pwrite(memfd, "xyz", 3, 0) == 3)
            close(memfd)
            #expect(try snapshot.readAll() == Array("abc".utf8))
            #expect(snapshot.withUnsafeFileDescriptor { sdk_is_snapshot_memfd($0) } == 1)
            let path = sdk_open_path_only("\(folder.path)/f")
            #expect(throws: FileAttachmentError.self) { try FileAttachment(duplicating: path) }
            close(path)

            try await withHost { host, _ in
                // From the worker: a pipe posing as a file is a protocol violation, and closed.
                let crasher = try host.extension(identifier: "com.example.crasher")
                await #expect {
                    _ = try await crasher.perform([ExtensionItem(title: "fd-pipe")])
                } throws: { error in
                    guard case RequestFailure.interrupted(.protocolViolation(let detail)) = error else { return false }
                    return detail.contains("a pipe")
                }
                // Returned attachments are read-only snapshots: nothing the worker could still change, nothing
                // that cannot be read.
                for (fault, expected) in [("fd-writable", "open for writing; attachments are read-only"),
                                          ("fd-opath", "an O_PATH descriptor, not an open file"),
                                          ("fd-unsealed", "a memfd not sealed against writing, growing and shrinking")] {
                    await #expect {
                        _ = try await crasher.perform([ExtensionItem(title: fault)])
                    } throws: { error in
                        guard case RequestFailure.interrupted(.protocolViolation(let detail)) = error else { return false }
                        return detail.contains("a descriptor attachment is \(expected)")
                    }
                }
                // From the app: more than 64 in one message cannot be sent; the request says so, nothing leaks.
                let echo = try host.extension(identifier: "com.example.echo")
                let many = try (0..<65).map { _ in try FileAttachment(contentsOf: "\(folder.path)/f") }
                await #expect {
                    _ = try await echo.perform([ExtensionItem(fileAttachments: many)])
                } throws: { error in
                    "\(error)".contains("at most 64")
                }
                // And the host serves on.
                #expect(try await echo.perform([ExtensionItem(title: "after")]).first?.title == "after")
            }
        }
    }
}

import Synchronization
