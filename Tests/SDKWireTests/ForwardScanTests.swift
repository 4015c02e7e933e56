// ForwardScan: the daemon forwards a begin or complete it has only scanned, so whatever the scan accepts must
// decode and parse as the same message. It may refuse valid messages (they are then decoded); it must never
// accept an invalid one. `ForwardScan.decode` builds the message by the same walk: without descriptors it takes
// exactly what the scan takes, charged as the scan charges it, the message a decode makes (charged no more than
// the decode and the items built from it: the walk builds no dictionary for the message or its items, which
// DecodedSizeTests holds against the heap); given the descriptors that arrived, it also takes messages with
// `fds` and `files`.
import HostTestSupport
@testable import SDKWire
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct ForwardScanTests {
    static let limits = WireLimits.default

    func payload(_ value: PlistValue) throws -> [UInt8] {
        Array(try Frame.encode(value).dropFirst(Frame.headerSize))
    }

    func scan(_ bytes: [UInt8], limits: WireLimits = limits) -> ScannedMessage? {
        bytes.withUnsafeBytes { ForwardScan.scan($0, limits: limits) }
    }

    /// What a full decode makes of `bytes`, in the scan's terms; nil when it is not a begin or complete without
    /// descriptors (or does not decode at all).
    func decoded(_ bytes: [UInt8], limits: WireLimits = limits) -> (ScannedMessage.Kind, RequestID, String?, Int64?, Int, Message)? {
        var cost = 0
        guard let plist = try? bytes.withUnsafeBytes({ try BinaryPlistDecoder.decode($0, limits: limits, decodedBytes: &cost) }),
            (try? Message.descriptorCount(of: plist)) == 0, let message = try? Message(plist: plist)
        else { return nil }
        cost += itemsCharge(plist)
        switch message {
        case .begin(let id, _, let ext, let deadline): return (.begin, id, ext, deadline, cost, message)
        case .complete(let id, _): return (.complete, id, nil, nil, cost, message)
        case .partial(let id, _): return (.partial, id, nil, nil, cost, message)
        default: return nil
        }
    }

    /// Checks the one property that matters; returns whether the scan took it.
    @discardableResult
    func agree(_ bytes: [UInt8], _ context: String, limits: WireLimits = limits) -> Bool {
        var directCost = -1
        let direct = bytes.withUnsafeBytes { ForwardScan.decode($0, limits: limits, decodedBytes: &directCost) }
        guard let scanned = scan(bytes, limits: limits) else {
            // The scan refuses what the direct decode refuses, and an id it could not rewrite in place (another
            // object overlaps it), which the direct decode, rewriting nothing, takes.
            if direct != nil {
                #expect(bytes.withUnsafeBytes { ForwardedFrame.idRange(in: $0) } == nil,
                        "\(context): decoded directly as \(String(describing: direct)) but not scanned")
            }
            return false
        }
        guard let (kind, id, ext, deadline, cost, message) = decoded(bytes, limits: limits) else {
            Issue.record("\(context): scanned as \(scanned) but does not decode to a begin, complete or partial: \(bytes)")
            return true
        }
        #expect(direct == message, "\(context): decoded directly as \(String(describing: direct)), not \(message)")
        // The walk builds no dictionary for the message or its items, and no array of them: it charges at most
        // what the tree and the message built from it are charged; the scan charges what the walk does.
        #expect(directCost <= cost, "\(context): the direct decode charged \(directCost), a decode \(cost)")
        #expect(scanned.kind == kind && scanned.id == id && scanned.extensionID == ext && scanned.deadlineMs == deadline,
                "\(context)")
        #expect(scanned.decodedBytes == directCost, "\(context): scan charged \(scanned.decodedBytes), the direct decode \(directCost)")
        #expect(bytes.withUnsafeBytes { ForwardedFrame.idRange(in: $0) } == scanned.idRange, "\(context)")
        return true
    }

    @Test func takesTheMessagesOurEncoderWrites() throws {
        let items = [ExtensionItem(title: "t", text: "päyload", attachments: ["a", .integer(7)], userInfo: ["k": .data([1, 2])]),
                     ExtensionItem()]
        let id = RequestID()
        let begin = try payload(Message.begin(id: id, items: items, extensionID: "com.example.echo", deadlineMs: 2500).plist)
        let scanned = try #require(scan(begin))
        #expect(scanned.kind == .begin && scanned.id == id && scanned.extensionID == "com.example.echo" && scanned.deadlineMs == 2500)
        #expect(agree(begin, "begin"))
        let complete = try payload(Message.complete(id: id, items: items).plist)
        #expect(scan(complete)?.kind == .complete)
        #expect(agree(complete, "complete"))
        // A partial result is scanned so that its receiver builds it by the same walk (nothing forwards it unread).
        let partial = try payload(Message.partial(id: id, items: items).plist)
        #expect(scan(partial)?.kind == .partial)
        #expect(agree(partial, "partial"))
        let bare = try payload(Message.begin(id: id, items: []).plist)
        #expect(scan(bare).map { ($0.extensionID, $0.deadlineMs) } ?? ("x", 1) == (nil, nil))
    }

    @Test func refusesWhatItMustLeaveToTheDecoder() throws {
        let id = RequestID()
        func top(_ d: [String: PlistValue]) throws -> [UInt8] {
            var all: [String: PlistValue] = ["type": "complete", "id": .string(id.uuidString), "items": .array([])]
            for (k, v) in d { all[k] = v }
            return try payload(.dictionary(all))
        }
        #expect(scan(try top([:])) != nil)
        // Descriptors: the frame is encoded again so that they go with it.
        #expect(scan(try top(["fds": 1])) == nil)
        #expect(scan(try top(["items": .array([.dictionary(["files": .array([0])])])])) == nil)
        #expect(scan(try top(["items": .array([.dictionary(["files": .array([])])])])) == nil)
        // Other types, and messages that do not parse.
        #expect(scan(try top(["type": "partial"]))?.kind == .partial)
        #expect(scan(try top(["type": "cancelled"])) == nil)
        #expect(scan(try top(["type": .integer(1)])) == nil)
        #expect(scan(try payload(.dictionary(["type": "complete", "id": .string(id.uuidString)]))) == nil)
        #expect(scan(try top(["id": "not-a-uuid"])) == nil)
        #expect(scan(try top(["items": .dictionary([:])])) == nil)
        #expect(scan(try top(["items": .array([.string("item")])])) == nil)
        #expect(scan(try top(["items": .array([.dictionary(["title": .integer(1)])])])) == nil)
        #expect(scan(try top(["items": .array([.dictionary(["attachments": .dictionary([:])])])])) == nil)
        #expect(scan(try top(["items": .array([.dictionary(["userInfo": .array([])])])])) == nil)
        #expect(scan(try top(["type": "begin", "extension": .integer(3)])) == nil)
        #expect(scan(try top(["type": "begin", "deadlineMs": "soon"])) == nil)
        // An id the forwarder cannot rewrite in place (UTF-16) and a UTF-16 key.
        #expect(scan(try top(["id": .string(id.uuidString + "é")])) == nil)
        #expect(scan(try top(["ïtems": .array([])])) == nil)  // a UTF-16 key might spell a known one
        // Unknown keys are fine, but their values are checked like any other.
        #expect(agree(try top(["later": .array([.dictionary(["x": .date(PlistDate(secondsSinceReferenceDate: 1))])])]), "unknown key"))
    }

    @Test func repeatedKeysAreRefusedOrCheckedAtEveryOccurrence() {
        let id = RequestID().uuidString
        let other = RequestID().uuidString
        // Objects: 0 top dict, then keys and values; our encoder never repeats a key, a hostile peer may.
        var b = RawPlist()
        let type = b.ascii("type"), complete = b.ascii("complete"), idKey = b.ascii("id"), items = b.ascii("items")
        let first = b.ascii(id), second = b.ascii(other), empty = b.array([])
        // Two ids: a decoder keeps the last, ForwardedFrame would rewrite the first. Both refuse.
        let top = b.dict([(type, complete), (idKey, first), (items, empty), (idKey, second)])
        var bytes = b.build(top: top)
        #expect(scan(bytes) == nil)
        #expect(bytes.withUnsafeBytes { ForwardedFrame.idRange(in: $0) } == nil)
        #expect(decoded(bytes)?.1 == RequestID(uuidString: other))  // it is valid; the decoded path takes it
        // An item's title twice: taken only if every occurrence is a string.
        b = RawPlist()
        let keys = (b.ascii("type"), b.ascii("complete"), b.ascii("id"), b.ascii(id), b.ascii("items"), b.ascii("title"))
        let s = b.ascii("a"), n = b.integer(5)
        for (firstTitle, secondTitle, taken) in [(s, s, true), (s, n, false), (n, s, false)] {
            var c = b
            let item = c.dict([(keys.5, firstTitle), (keys.5, secondTitle)])
            let top = c.dict([(keys.0, keys.1), (keys.2, keys.3), (keys.4, c.array([item]))])
            bytes = c.build(top: top)
            #expect((scan(bytes) != nil) == taken)
            #expect(agree(bytes, "title twice") == taken)
        }
    }

    @Test func sharedObjectsCyclesAndDepthAreChargedAsTheDecoderChargesThem() {
        let id = RequestID().uuidString
        var b = RawPlist()
        let keys = (b.ascii("type"), b.ascii("complete"), b.ascii("id"), b.ascii(id), b.ascii("items"))
        let blob = b.data(Array(repeating: 7, count: 200))
        let attachments = b.ascii("attachments")
        let list = b.array(Array(repeating: blob, count: 12))
        let item = b.dict([(attachments, list)])
        // One item referenced 20 times: each reference charged in full, as a decode would.
        let top = b.dict([(keys.0, keys.1), (keys.2, keys.3), (keys.4, b.array(Array(repeating: item, count: 20)))])
        var bytes = b.build(top: top)
        #expect(agree(bytes, "shared"))
        // The same with a small byte budget: both must refuse it.
        #expect(scan(bytes, limits: WireLimits(maxDecodedBytes: 20_000)) == nil)
        #expect(decoded(bytes, limits: WireLimits(maxDecodedBytes: 20_000)) == nil)
        // A userInfo that contains itself.
        b = RawPlist()
        let k = (b.ascii("type"), b.ascii("complete"), b.ascii("id"), b.ascii(id), b.ascii("items"), b.ascii("userInfo"), b.ascii("me"))
        let selfRef = b.count + 1  // the dict after the item below refers to itself
        let cyclicItem = b.dict([(k.5, selfRef)])
        _ = b.dict([(k.6, selfRef)])
        let cyclicTop = b.dict([(k.0, k.1), (k.2, k.3), (k.4, b.array([cyclicItem]))])
        bytes = b.build(top: cyclicTop)
        #expect(scan(bytes) == nil)
        #expect(decoded(bytes) == nil)
        // Nesting past the limit inside an attachment.
        let deep = PlistValue.dictionary(["type": "complete", "id": .string(id), "items": .array([.dictionary(["attachments":
            .array([(0..<20).reduce(PlistValue.integer(1)) { inner, _ in .array([inner]) }])])])])
        let encoded = Array(try! Frame.encode(deep).dropFirst(Frame.headerSize))
        #expect(scan(encoded, limits: WireLimits(maxDepth: 10)) == nil)
        #expect(decoded(encoded, limits: WireLimits(maxDepth: 10)) == nil)
        #expect(agree(encoded, "deep, within the default limit"))
    }

    /// A status report passed over unbuilt (the simulation's clients do) must be one a decode reads as a status
    /// report without descriptors; anything refused is decoded as usual.
    @Test func aStatusReportIsTakenOnlyWhenItDecodesAsOne() throws {
        func isReport(_ bytes: [UInt8]) -> Bool { bytes.withUnsafeBytes { ForwardScan.isStatusReport($0, limits: Self.limits) } }
        func decodesAsReport(_ bytes: [UInt8]) -> Bool {
            guard let plist = try? bytes.withUnsafeBytes({ try BinaryPlistDecoder.decode($0, limits: Self.limits) }),
                (try? Message.descriptorCount(of: plist)) == 0, case .statusReport? = try? Message(plist: plist)
            else { return false }
            return true
        }
        let report: PlistValue = ["pid": 7, "extensions": .array([["identifier": "com.example.echo", "requests": 3]])]
        let valid = try payload(Message.statusReport(seq: 4, report: report).plist)
        #expect(isReport(valid) && decodesAsReport(valid))
        // Refused: what a decode refuses, and what it reads as something else or with descriptors.
        let refused: [PlistValue] = [
            ["type": "statusReport", "seq": 4], ["type": "statusReport", "report": report],
            ["type": "statusReport", "seq": "4", "report": report], ["type": "statusReport", "seq": 4, "report": report, "fds": 0],
            ["type": "status", "seq": 4], Message.ping(seq: 1).plist, ["seq": 4, "report": report], .array(["statusReport"]),
        ]
        for value in refused { #expect(!isReport(try payload(value)), "\(value)") }
        // Its bytes mutated: whatever is still taken decodes as a status report.
        let seed = testSeed(default: 0x57A7)
        var g = SeededGenerator(seed: seed)
        var taken = 0
        for round in 0..<3_000 {
            var mutated = valid
            for _ in 0..<Int.random(in: 1...3, using: &g) {
                let index = Int.random(in: 0..<mutated.count, using: &g)
                mutated[index] ^= 1 << UInt8.random(in: 0..<8, using: &g)
            }
            if isReport(mutated) {
                taken += 1
                #expect(decodesAsReport(mutated), "seed \(seed) round \(round): taken, yet not decoded as a status report")
            }
        }
        #expect(taken > 0, "seed \(seed): no mutation was still a report")
    }

    /// Random messages near the valid ones, then their bytes mutated: whatever the scan takes, the decoder takes
    /// as the same message.
    @Test func agreesWithTheDecoderOnRandomAndMutatedMessages() throws {
        let seed = testSeed(default: 0x5CA7)
        var g = SeededGenerator(seed: seed)
        var taken = 0, takenMutated = 0
        for round in 0..<3_000 {
            let bytes = try payload(Self.nearlyAMessage(&g))
            if agree(bytes, "seed \(seed) round \(round)") { taken += 1 }
            for _ in 0..<3 {
                var mutated = bytes
                for _ in 0..<Int.random(in: 1...3, using: &g) {
                    let index = Int.random(in: 0..<mutated.count, using: &g)
                    mutated[index] = Bool.random(using: &g)
                        ? mutated[index] ^ (1 << UInt8.random(in: 0..<8, using: &g))
                        : [0x00, 0x0F, 0x10, 0x24, 0x5F, 0x7F, 0x80, 0xA1, 0xD1, 0xFF].randomElement(using: &g)!
                }
                if agree(mutated, "seed \(seed) round \(round) mutated") { takenMutated += 1 }
            }
        }
        // Both must be exercised: plenty of messages taken, and some mutations that still scan.
        #expect(taken > 100, "seed \(seed): only \(taken) of 3000 taken")
        #expect(takenMutated > 0, "seed \(seed)")
    }

    /// With the descriptors that arrived, the walk also reads `fds` and the items' `files`: whatever it takes, the
    /// decoder and `Message(plist:files:)` take as the same message, with the same descriptors, claiming as many
    /// and charging as much; and it takes the messages our encoder writes with files.
    @Test func claimsDescriptorsAsTheDecoderClaimsThem() throws {
        let seed = testSeed(default: 0xFD5)
        var g = SeededGenerator(seed: seed)
        let pool = try (0..<4).map { try FileAttachment(bytes: [UInt8($0)]) }
        func slow(_ bytes: [UInt8], _ available: [FileAttachment]) -> (Message, Int, Int)? {
            var cost = 0
            guard let plist = try? bytes.withUnsafeBytes({ try BinaryPlistDecoder.decode($0, limits: Self.limits, decodedBytes: &cost) }),
                let count = try? Message.descriptorCount(of: plist), count <= available.count,
                let message = try? Message(plist: plist, files: Array(available.prefix(count)))
            else { return nil }
            return (message, count, cost + itemsCharge(plist))
        }
        var taken = 0, takenWithFiles = 0
        func check(_ bytes: [UInt8], _ available: [FileAttachment], _ context: String) {
            var cost = -1
            guard let (message, claimed) = bytes.withUnsafeBytes({
                ForwardScan.decode($0, limits: Self.limits, decodedBytes: &cost, available: available)
            }) else { return }
            taken += 1
            if !message.fileAttachments.isEmpty { takenWithFiles += 1 }
            guard let (expected, count, expectedCost) = slow(bytes, available) else {
                Issue.record("\(context): taken as \(message) claiming \(claimed), but the decoder refuses it")
                return
            }
            #expect(message == expected, "\(context)")
            #expect(claimed == count, "\(context): claimed \(claimed), the decoder \(count)")
            #expect(cost <= expectedCost, "\(context): charged \(cost), the decoder \(expectedCost)")
        }
        // What our encoder writes: every file resolved to the very attachment sent.
        let id = RequestID()
        let items = [ExtensionItem(title: "a", fileAttachments: [pool[0], pool[1]]), ExtensionItem(),
                     ExtensionItem(text: "b", fileAttachments: [pool[2]])]
        for message in [Message.begin(id: id, items: items, extensionID: "com.example.echo"), .complete(id: id, items: items),
                        .partial(id: id, items: items)] {
            let bytes = try payload(message.plist)
            var cost = 0
            let read = bytes.withUnsafeBytes { ForwardScan.decode($0, limits: Self.limits, decodedBytes: &cost, available: pool) }
            #expect(read?.message == message && read?.claimed == 3, "\(message)")
            #expect(scan(bytes) == nil, "a message with descriptors is never forwarded unread")
        }
        for round in 0..<2_000 {
            var d: [String: PlistValue] = ["type": .string(["begin", "complete", "partial"].randomElement(using: &g)!),
                                           "id": .string(RequestID().uuidString)]
            // Mostly as many as arrived and indices in range (taken), else anything near that (left to the decoder).
            let available = Array(pool.prefix(Int.random(in: 0...4, using: &g)))
            let fds = Int.random(in: 0..<4, using: &g) > 0 ? Int64(available.count) : Int64.random(in: -1...4, using: &g)
            func index() -> Int64 {
                Int.random(in: 0..<5, using: &g) > 0 && fds > 0 ? Int64.random(in: 0..<fds, using: &g) : Int64.random(in: -1...4, using: &g)
            }
            switch Int.random(in: 0..<8, using: &g) {
            case 0: break
            case 1: d["fds"] = .string("2")
            default: d["fds"] = .integer(fds)
            }
            d["items"] = .array((0..<Int.random(in: 0..<3, using: &g)).map { _ in
                var item: [String: PlistValue] = ["title": "t"]
                switch Int.random(in: 0..<6, using: &g) {
                case 0: break
                case 1: item["files"] = .integer(0)
                case 2: item["files"] = .array([.string("0")])
                default: item["files"] = .array((0..<Int.random(in: 0..<3, using: &g)).map { _ in .integer(index()) })
                }
                return .dictionary(item)
            })
            let bytes = try payload(.dictionary(d))
            check(bytes, available, "seed \(seed) round \(round)")
            var mutated = bytes
            let index = Int.random(in: 0..<mutated.count, using: &g)
            mutated[index] ^= 1 << UInt8.random(in: 0..<8, using: &g)
            check(mutated, available, "seed \(seed) round \(round) mutated")
        }
        #expect(takenWithFiles > 100, "seed \(seed): only \(takenWithFiles) taken with files")
        #expect(taken > takenWithFiles, "seed \(seed)")
    }

    /// A frame with descriptors read as a receiver reads it (`IncomingDescriptors.nextMessage`): its items get the
    /// descriptors that arrived, in the order the frame numbers them; a frame that says it carries more than
    /// arrived is an error, and one that leaves some unclaimed is a problem for the connection.
    @Test func aFrameWithDescriptorsClaimsWhatArrivedWithIt() throws {
        let files = try (0..<3).map { try FileAttachment(bytes: [UInt8(10 + $0)]) }
        let id = RequestID()
        let message = Message.complete(id: id, items: [ExtensionItem(title: "a", fileAttachments: [files[1], files[0]]),
                                                       ExtensionItem(fileAttachments: [files[2]])])
        var frame: [UInt8] = []
        var encoder = BinaryPlistEncoder()
        var outgoing = OutgoingDescriptors()
        try outgoing.encode(message, with: &encoder, appendingTo: &frame)
        /// The frame as a receiver gets it, with `extra` more descriptors than it carries (negative: fewer).
        func receive(extra: Int) throws -> (Message?, IncomingDescriptors) {
            let sent = message.fileAttachments + (extra > 0 ? Array(files.prefix(extra)) : [])
            var raw = sent.prefix(sent.count + min(extra, 0)).map { fcntl($0.rawDescriptor, F_DUPFD_CLOEXEC, 0) }
            var incoming = IncomingDescriptors()
            #expect(incoming.adopt(&raw, truncated: false) == nil)
            var reader = FrameReader()
            frame.withUnsafeBytes { reader.append($0) }
            return (try incoming.nextMessage(from: &reader), incoming)
        }
        let (read, incoming) = try receive(extra: 0)
        guard case .complete(let readID, let items)? = read else {
            Issue.record("read as \(String(describing: read))")
            return
        }
        #expect(readID == id && incoming.lastClaimed == 3 && incoming.unclaimedProblem(frameHalfRead: false) == nil)
        #expect(try items.map { try $0.fileAttachments.map { try $0.readAll() } } == [[[11], [10]], [[12]]])
        #expect(items.flatMap(\.fileAttachments).allSatisfy { received in !files.contains { $0 === received } },
                "the received descriptors are the receiver's own")
        #expect(throws: MessageError.self) { _ = try receive(extra: -1) }
        #expect(try receive(extra: 1).1.unclaimedProblem(frameHalfRead: false) != nil)
    }

    /// A hostile peer's layouts our encoder never writes: an item's `files` twice (the last stands, as in a decoded
    /// dictionary) and one `files` list shared by two items (charged at each reference, as a decode charges it).
    @Test func filesGivenTwiceOrSharedAreReadAsTheDecoderReadsThem() throws {
        let pool = try (0..<2).map { try FileAttachment(bytes: [UInt8($0)]) }
        let id = RequestID().uuidString
        var b = RawPlist()
        let keys = (b.ascii("type"), b.ascii("complete"), b.ascii("id"), b.ascii(id), b.ascii("items"), b.ascii("files"), b.ascii("fds"))
        let zero = b.integer(0), one = b.integer(1), two = b.integer(2), notANumber = b.ascii("0")
        let first = b.array([zero]), second = b.array([one]), bad = b.array([notANumber])
        for (a, c) in [(first, second), (second, first), (bad, first), (first, bad)] {
            var r = b
            let item = r.dict([(keys.5, a), (keys.5, c)])
            let top = r.dict([(keys.0, keys.1), (keys.2, keys.3), (keys.4, r.array([item])), (keys.6, two)])
            let bytes = r.build(top: top)
            var cost = 0
            let fast = bytes.withUnsafeBytes { ForwardScan.decode($0, limits: Self.limits, decodedBytes: &cost, available: pool) }
            var slowCost = 0
            let plist = try bytes.withUnsafeBytes { try BinaryPlistDecoder.decode($0, limits: Self.limits, decodedBytes: &slowCost) }
            let slow = try? Message(plist: plist, files: pool)
            if let fast {
                #expect(fast.message == slow && fast.claimed == 2 && cost <= slowCost + itemsCharge(plist), "\(a), \(c)")
            } else {
                #expect(a == bad || c == bad, "a valid layout was refused: \(a), \(c)")
            }
            if c == bad { #expect(slow == nil && fast == nil) }
        }
        var r = b
        let shared = r.array([one, zero])
        let itemA = r.dict([(keys.5, shared)]), itemB = r.dict([(keys.5, shared)])
        let items = r.array([itemA, itemB])
        let top = r.dict([(keys.0, keys.1), (keys.2, keys.3), (keys.4, items), (keys.6, two)])
        let bytes = r.build(top: top)
        var cost = 0, slowCost = 0
        let fast = try #require(bytes.withUnsafeBytes { ForwardScan.decode($0, limits: Self.limits, decodedBytes: &cost, available: pool) })
        let plist = try bytes.withUnsafeBytes { try BinaryPlistDecoder.decode($0, limits: Self.limits, decodedBytes: &slowCost) }
        #expect(fast.message == (try Message(plist: plist, files: pool)) && cost <= slowCost + itemsCharge(plist))
    }

    static func nearlyAMessage(_ g: inout SeededGenerator) -> PlistValue {
        func pick<T>(_ options: [T]) -> T { options.randomElement(using: &g)! }
        var d: [String: PlistValue] = [:]
        d["type"] = pick(["begin", "complete", "complete", "begin", "partial", .integer(1)])
        if Int.random(in: 0..<12, using: &g) > 0 {
            let id = RequestID().uuidString
            d["id"] = pick([.string(id), .string(id), .string(id.lowercased()), .string(String(id.dropLast())), .integer(9)])
        }
        if Bool.random(using: &g) { d["extension"] = pick(["com.example.echo", "é", .integer(1)]) }
        if Bool.random(using: &g) { d["deadlineMs"] = pick([.integer(RandomPlist.integer(&g)), .real(1), "x"]) }
        if Int.random(in: 0..<10, using: &g) == 0 { d["fds"] = .integer(Int64.random(in: 0...2, using: &g)) }
        if Int.random(in: 0..<4, using: &g) == 0 { d[RandomPlist.string(&g)] = RandomPlist.value(&g) }
        if Int.random(in: 0..<12, using: &g) > 0 {
            let items = (0..<Int.random(in: 0..<4, using: &g)).map { _ -> PlistValue in
                if Int.random(in: 0..<15, using: &g) == 0 { return RandomPlist.value(&g) }
                var item: [String: PlistValue] = [:]
                let keys = ["title", "text", "attachments", "userInfo", "files", "other"]
                for key in keys where Bool.random(using: &g) {
                    switch (key, Int.random(in: 0..<8, using: &g)) {
                    case (_, 0): item[key] = RandomPlist.value(&g)
                    case ("title", _), ("text", _): item[key] = .string(RandomPlist.string(&g))
                    case ("attachments", _): item[key] = .array((0..<Int.random(in: 0..<3, using: &g)).map { _ in RandomPlist.value(&g) })
                    case ("userInfo", _): item[key] = .dictionary([RandomPlist.string(&g): RandomPlist.value(&g)])
                    case ("files", _): if Int.random(in: 0..<3, using: &g) == 0 { item[key] = .array([]) }
                    default: item[key] = RandomPlist.value(&g)
                    }
                }
                return .dictionary(item)
            }
            d["items"] = Int.random(in: 0..<15, using: &g) == 0 ? RandomPlist.value(&g) : .array(items)
        }
        return .dictionary(d)
    }
}

/// What the items a decoded message's tree becomes are charged on top of the tree (by the receivers'
/// `IncomingDescriptors.message(from:decodedBytes:budget:)`, and by the walk that builds them directly).
func itemsCharge(_ plist: PlistValue) -> Int {
    guard case .dictionary(let fields) = plist, case .array(let items)? = fields["items"] else { return 0 }
    return items.count * MemoryLayout<ExtensionItem>.stride
}

/// A bplist00 laid out by hand (LimitTests' `handBuilt`), one object at a time, with 2-byte offsets and 1-byte references: for what our
/// encoder never writes (a key twice, a container inside itself).
struct RawPlist {
    private var objects: [[UInt8]] = []
    var count: Int { objects.count }

    private mutating func add(_ bytes: [UInt8]) -> Int {
        objects.append(bytes)
        return objects.count - 1
    }

    /// A marker with its count (one byte past 14), as an object's header.
    static func header(_ marker: UInt8, _ n: Int) -> [UInt8] {
        n < 15 ? [marker | UInt8(n)] : [marker | 0x0F, 0x10, UInt8(n)]
    }

    mutating func ascii(_ s: String) -> Int { add(Self.header(0x50, s.utf8.count) + Array(s.utf8)) }
    mutating func integer(_ v: UInt8) -> Int { add([0x10, v]) }
    mutating func data(_ bytes: [UInt8]) -> Int { add(Self.header(0x40, bytes.count) + bytes) }
    mutating func array(_ refs: [Int]) -> Int { add(Self.header(0xA0, refs.count) + refs.map { UInt8($0) }) }
    mutating func dict(_ entries: [(Int, Int)]) -> Int {
        add(Self.header(0xD0, entries.count) + entries.map { UInt8($0.0) } + entries.map { UInt8($0.1) })
    }

    func build(top: Int) -> [UInt8] {
        handBuilt(objects: objects, top: UInt64(top), offsetSize: 2)
    }
}
