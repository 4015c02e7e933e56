// The second slice's public API for app authors (shared/DESIGN.md "For app and extension authors"): typed
// payloads, extension points, the request id and pid of a perform, worker lifecycle events, outcomes as an
// AsyncSequence, main-actor handlers, Duration deadlines, and crash reports with their fatal-error line.
import SDKHost
import SDKWire
import Synchronization
import Testing
import HostTestSupport

#if canImport(Glibc)
import Glibc
#endif

struct Greeting: Codable, Equatable {
    var name: String
    var times: Int
    var scores: [Double]
    var nickname: String?
    var tags: [String: Bool]
    var when: PlistDate
    var nested: [Inner]

    struct Inner: Codable, Equatable {
        var id: UInt32
        var flag: Bool
    }
}

@MainActor final class Model {
    var completed: [RequestID] = []
    var interrupted: [RequestID: InterruptionReason] = [:]
}

@Suite struct PlistCoderTests {
    @Test func codableValuesRoundTripThroughPlistValueAndTheWire() throws {
        let value = Greeting(name: "Ada", times: 3, scores: [1.5, -2], nickname: nil, tags: ["x": true],
                             when: PlistDate(secondsSince1970: 1_700_000_000), nested: [.init(id: 7, flag: false)])
        let plist = try PlistValueEncoder().encode(value)
        #expect(plist["nickname"] == nil, "nil is left out: property lists have no null")
        #expect(plist["when"] == .date(PlistDate(secondsSince1970: 1_700_000_000)))
        // Through the binary codec and back, as the worker would see it.
        let wire = try BinaryPlistDecoder.decode(BinaryPlistEncoder.encode(plist))
        #expect(try PlistValueDecoder().decode(Greeting.self, from: wire) == value)
        let item = try ExtensionItem(encoding: value, title: "greeting")
        #expect(try item.decode(Greeting.self) == value)
    }

    struct EveryPrimitive: Codable, Equatable {
        var i8: Int8 = -8, i16: Int16 = -16, i32: Int32 = -32, i64: Int64 = .min, i: Int = -1
        var u8: UInt8 = 8, u16: UInt16 = 16, u32: UInt32 = .max, u64: UInt64 = UInt64(Int64.max), u: UInt = 1
        var f: Float = 0.5, d: Double = -0.25, b: Bool = true, s: String = "é", date = PlistDate(secondsSince1970: 2)
        var list: [Int16] = [1, -1], flags: [Bool] = [false], plist: PlistValue = ["k": [1, "v"]]
    }

    /// Reads its encoder's coding path, as some hand-written `encode(to:)`s do.
    struct PathReporter: Encodable {
        func encode(to encoder: any Encoder) throws {
            var c = encoder.singleValueContainer()
            try c.encode(encoder.codingPath.map(\.stringValue).joined(separator: "/"))
        }
    }

    @Test func everyPrimitiveEncodesAsItsPlistKindAndErrorsNameTheirPath() throws {
        let value = EveryPrimitive()
        let plist = try PlistValueEncoder().encode(value)
        #expect(plist["i64"] == .integer(.min) && plist["u32"] == .integer(Int64(UInt32.max)) && plist["u64"] == .integer(.max))
        #expect(plist["f"] == .real(0.5) && plist["b"] == .bool(true) && plist["s"] == .string("é"))
        #expect(plist["date"] == .date(PlistDate(secondsSince1970: 2)) && plist["list"] == [1, -1] && plist["plist"] == ["k": [1, "v"]])
        #expect(try PlistValueDecoder().decode(EveryPrimitive.self, from: plist) == value)
        // An integer past Int64.max, deep inside: the error's path leads to it, keyed and unkeyed.
        struct Deep: Encodable { var outer: [String: [UInt64]] }
        do {
            _ = try PlistValueEncoder().encode(Deep(outer: ["a": [1, .max]]))
            Issue.record("encoded UInt64.max")
        } catch let EncodingError.invalidValue(_, context) {
            #expect(context.codingPath.map(\.stringValue) == ["outer", "a", "Index 1"])
        }
        do {
            _ = try PlistValueEncoder().encode(["x": [Int?.some(1), nil]])
            Issue.record("encoded nil in an array")
        } catch let EncodingError.invalidValue(_, context) {
            #expect(context.codingPath.map(\.stringValue) == ["x", "Index 1"])
        }
        #expect(try PlistValueEncoder().encode(["p": [PathReporter()]]) == ["p": ["p/Index 0"]])
    }

    @Test func decodingErrorsNameThePath() throws {
        let bad: PlistValue = ["name": "Ada", "times": "three", "scores": [], "tags": [:], "when": .date(PlistDate(secondsSince1970: 0)), "nested": []]
        do {
            _ = try PlistValueDecoder().decode(Greeting.self, from: bad)
            Issue.record("decoded a string as an Int")
        } catch let DecodingError.typeMismatch(_, context) {
            #expect(context.codingPath.map(\.stringValue) == ["times"])
        }
        #expect(throws: EncodingError.self) { try PlistValueEncoder().encode([UInt64.max]) }
        #expect(throws: EncodingError.self) { try PlistValueEncoder().encode([Int?.none]) }
        #expect(throws: DecodingError.self) { try ExtensionItem().decode(Greeting.self) }
        // A file is not a payload, and the error says which was expected and what the item has.
        let withFile = ExtensionItem(fileAttachments: [try FileAttachment(bytes: [1, 2, 3])])
        do {
            _ = try withFile.decode(Greeting.self)
            Issue.record("decoded a file as a payload")
        } catch let DecodingError.valueNotFound(_, context) {
            #expect(context.debugDescription.contains("no payload value (its attachments are empty)")
                && context.debugDescription.contains("1 file(s) in fileAttachments"), "\(context.debugDescription)")
        }
        #expect(withFile.description == "ExtensionItem(files: 3 bytes)")
        #expect(ExtensionItem(title: "hi", attachments: [1, 2]).description == #"ExtensionItem(title: "hi", attachments: 2 values)"#)
    }

    @Test func itemTextTravelsAndIllTypedTextIsRefused() throws {
        let item = ExtensionItem(title: "t", text: "body")
        #expect(try ExtensionItem(plist: try BinaryPlistDecoder.decode(BinaryPlistEncoder.encode(item.plist))) == item)
        #expect(throws: MessageError.self) { try ExtensionItem(plist: ["text": 5]) }
    }
}

@Suite struct PublicAPITests {
    @Test func typedPerformThroughARealWorker() async throws {
        try await withHost { host, _ in
            let echo = try host.extension(identifier: "com.example.echo")
            let value = Greeting(name: "Grace", times: 1, scores: [], nickname: "amazing", tags: [:],
                                 when: PlistDate(secondsSinceReferenceDate: 0), nested: [])
            // Echo returns its input: the response decodes as the request's own type.
            #expect(try await echo.perform(value, returning: Greeting.self, deadline: .seconds(30)) == value)
            struct Other: Decodable { var missing: Int }
            await #expect(throws: DecodingError.self) { try await echo.perform(value, returning: Other.self) }
        }
    }

    @Test func extensionsCarryTheirExtensionPoints() async throws {
        try await withHost { host, _ in
            #expect(host.mode == .embedded)
            #expect(host.extensions.map(\.identifier) == host.extensionIdentifiers)
            let echo = try #require(host.extensions.first { $0.identifier == "com.example.echo" })
            #expect(echo.extensionPointIdentifier == "com.sdk-host.service")
            #expect(host.extensions(forExtensionPoint: "com.sdk-host.service").contains(echo))
            #expect(host.extensions(forExtensionPoint: "no.such.point").isEmpty)
        }
    }

    @Test func startGivesTheIdAndPidOfARequest() async throws {
        try await withHost { host, _ in
            let crasher = try host.extension(identifier: "com.example.crasher")
            let task = crasher.start([ExtensionItem(title: "slow:20000")], deadline: .seconds(60))
            #expect(await eventually(timeout: 20) { task.pid != nil })
            let pid = try #require(task.pid)
            #expect(crasher.pid(for: task.id) == pid)
            #expect(kill(pid, 0) == 0)
            task.cancel()
            #expect(await task.outcome == .cancelled(.cancelledByHost))
            #expect(task.pid == pid, "the pid that served it stays known after the end")
            await #expect(throws: RequestFailure.self) { try await task.value }
        }
    }

    @Test func cancellingThePerformingTaskCancelsTheRequest() async throws {
        try await withHost { host, _ in
            let crasher = try host.extension(identifier: "com.example.crasher")
            let waiting = Task { try await crasher.perform([ExtensionItem(title: "slow:20000")], deadline: .seconds(60)) }
            try await Task.sleep(nanoseconds: 300_000_000)
            waiting.cancel()
            await #expect(throws: CancellationError.self) { try await waiting.value }
        }
    }

    @Test func workerEventsFollowALifeAndACrash() async throws {
        try await withHost { host, _ in
            let events = host.workerEvents()
            let crasher = try host.extension(identifier: "com.example.crasher")
            let task = crasher.start([ExtensionItem(title: "segv")])
            #expect(await task.outcome == .interrupted(.signal(SIGSEGV)))
            let seen = await eventsUntilExit(events)
            #expect(seen.map(\.kind) == [.spawned, .ready, .exited], "\(seen)")
            #expect(Set(seen.map(\.pid)) == [task.pid ?? -1])
            #expect(seen.last?.reason == .signal(SIGSEGV))
            #expect(seen.allSatisfy { $0.extensionIdentifier == "com.example.crasher" })
        }
    }

    @Test func outcomesAsAnAsyncSequenceAndOnTheMainActor() async throws {
        try await withHost { host, _ in
            let echo = try host.extension(identifier: "com.example.echo")
            let ended = echo.outcomes()
            let ids = (0..<3).map { echo.beginRequest(withInputItems: [ExtensionItem(title: "\($0)")], deadline: .seconds(30)) }
            var got: [RequestID: RequestOutcome] = [:]
            for await end in ended {
                got[end.id] = end.outcome
                if got.count == ids.count { break }
            }
            #expect(Set(got.keys) == Set(ids))
            #expect(got.values.allSatisfy { if case .completed = $0 { true } else { false } })

            // Handlers that touch @MainActor state directly.
            let model = await MainActor.run { Model() }
            let crasher = try host.extension(identifier: "com.example.crasher")
            crasher.setMainActorHandlers(
                completion: { id, _ in model.completed.append(id) },
                cancellation: { _, _ in },
                interruption: { id, reason in model.interrupted[id] = reason })
            // One after the other: on the same worker, an abort begun at once can take the echo down with it.
            let done = crasher.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
            #expect(await eventually(timeout: 30) { await MainActor.run { model.completed == [done] } })
            let crashed = crasher.beginRequest(withInputItems: [ExtensionItem(title: "abort")])
            #expect(await eventually(timeout: 30) { await MainActor.run { model.completed == [done] && model.interrupted[crashed] != nil } })
            #expect(await MainActor.run { model.interrupted[crashed] } == .signal(SIGABRT))
        }
    }

    @Test func crashReportsCarryTheFatalErrorLine() async throws {
        try await withHost { host, _ in
            let crasher = try host.extension(identifier: "com.example.crasher")
            let outcome = await crasher.start([ExtensionItem(title: "range")]).outcome
            guard case .interrupted = outcome else {
                Issue.record("range ended \(outcome)")
                return
            }
            let reports = await host.crashReports()
            let report = try #require(reports.last)
            #expect(report.extensionIdentifier == "com.example.crasher")
            #expect(report.fatalErrorLine?.contains("Fatal error: Index out of range") == true,
                    "\(report.fatalErrorLine ?? "nil") from \(report.stderrTail)")
            // The status carries the same reports, and the plist form keeps the line.
            #expect(CrashReport(plist: report.plist)?.fatalErrorLine == report.fatalErrorLine)
        }
    }
}
