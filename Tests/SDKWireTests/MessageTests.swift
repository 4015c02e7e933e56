// Protocol messages: every type round-trips through bplist, request ids parse and print as UUIDs, and
// malformed messages say which field is wrong.
import SDKWire
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct MessageTests {
    static let id = RequestID(uuidString: "6F9619FF-8B86-4011-B42D-00C04FC964FF")!
    static let messages: [Message] = [
        .hello(version: 1, identifier: "com.example.echo", hostPid: 42, idleTimeoutMs: 30_000),
        .welcome(version: 1, identifier: "com.example.echo", pid: 43),
        .begin(id: id, items: [ExtensionItem(title: "t", attachments: ["a", .data([1])], userInfo: ["k": 1])]),
        .complete(id: id, items: [ExtensionItem(), ExtensionItem(title: "ü")]),
        .cancel(id: id),
        .cancelled(id: id, error: ExtensionError(domain: "d", code: -3, message: "m")),
        .ping(seq: 7), .pong(seq: 7), .error(message: "bad", id: id), .error(message: "bad", id: nil),
        .begin(id: id, items: [], extensionID: "com.example.echo", deadlineMs: 1500),
        .connect(version: 1), .connected(version: 1, pid: 9, extensions: ["a", "b"]), .assigned(id: id, pid: 12),
        .connected(version: 1, pid: 9, extensions: ["a"], extensionPoints: ["a": "p"], problems: ["a": "refused a: refused: owned by uid 7"]),
        .interrupted(id: id, reason: ["kind": "signal", "code": 11]), .status(seq: 3),
        .statusReport(seq: 3, report: ["extensions": []]),
        .unknown(type: "stream-event"),
        .partial(id: id, items: [ExtensionItem(title: "1 of 3")]), .credit(id: id, count: 4),
    ]

    @Test(arguments: messages)
    func roundTrip(_ message: Message) throws {
        let bytes = BinaryPlistEncoder.encode(message.plist)
        #expect(try Message(plist: BinaryPlistDecoder.decode(bytes)) == message)
    }

    @Test func requestIDFormatAndParse() {
        #expect(Self.id.uuidString == "6F9619FF-8B86-4011-B42D-00C04FC964FF")
        #expect(RequestID(uuidString: "6f9619ff-8b86-4011-b42d-00c04fc964ff") == Self.id)
        #expect(RequestID(uuidString: "6F9619FF8B864011B42D00C04FC964FF") == nil)
        #expect(RequestID(uuidString: "6F9619FF-8B86-4011-B42D-00C04FC964FG") == nil)
        let fresh = RequestID()
        #expect(RequestID(uuidString: fresh.uuidString) == fresh)
        #expect(fresh.uuidString[fresh.uuidString.index(fresh.uuidString.startIndex, offsetBy: 14)] == "4")
        #expect(Set((0..<1000).map { _ in RequestID() }).count == 1000)
        // Every digit value at every position, against the words formatted another way.
        for _ in 0..<2_000 {
            let id = RequestID()
            func hex(_ v: UInt64, _ n: Int) -> String {
                let s = String(v & (n == 16 ? .max : (1 << UInt64(4 * n)) - 1), radix: 16, uppercase: true)
                return String(repeating: "0", count: n - s.count) + s
            }
            let h = hex(id.high, 16), l = hex(id.low, 16)
            let expected = "\(h.prefix(8))-\(h.dropFirst(8).prefix(4))-\(h.suffix(4))-\(l.prefix(4))-\(l.suffix(12))"
            #expect(id.uuidString == expected)
            // The public parse takes either case; a message's id only the upper-case form (the host answers under
            // the id it parsed, written upper case).
            #expect(RequestID(uuidString: id.uuidString.lowercased()) == id)
            #expect(RequestID(wireString: id.uuidString.lowercased()) == nil || id.uuidString.lowercased() == id.uuidString)
        }
        // Every byte that is not an upper-case hex digit (lower-case ones too), at every digit position, is refused.
        let valid = Array("6F9619FF-8B86-4011-B42D-00C04FC964FF".utf8)
        let hexBytes = Set("0123456789ABCDEF".utf8)
        var refused = 0
        for position in valid.indices where valid[position] != UInt8(ascii: "-") {
            for byte in UInt8.min...UInt8.max where !hexBytes.contains(byte) {
                var bad = valid
                bad[position] = byte
                if bad.withUnsafeBytes({ RequestID(uuidBytes: $0) }) == nil { refused += 1 }
            }
        }
        #expect(refused == 32 * (256 - 16))
        for edge in ["00000000-0000-0000-0000-000000000000", "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", "09AF09AF-9A0F-A9F0-0F9A-F0A90F9AF0A9"] {
            #expect(RequestID(uuidString: edge)?.uuidString == edge)
        }
    }

    @Test func requestIDsFromManyThreadsAreDistinctAndVersion4() async {
        // Each thread draws from its own pool of random bytes; across 8 threads, 4000 ids (250 refills) all differ.
        let ids = await withTaskGroup(of: [RequestID].self) { group in
            for _ in 0..<8 { group.addTask { (0..<500).map { _ in RequestID() } } }
            var all: [RequestID] = []
            for await some in group { all += some }
            return all
        }
        #expect(Set(ids).count == ids.count)
        #expect(ids.allSatisfy { ($0.high >> 12) & 0xF == 4 && $0.low >> 62 == 2 })
    }

    @Test func aForkedChildDoesNotRepeatItsParentsNextRequestID() throws {
        // The parent's pool holds bytes for 15 more ids when it forks; a child that kept them would make the very
        // id the parent makes next.
        _ = RequestID()
        var fds: [Int32] = [-1, -1]
        #expect(pipe(&fds) == 0)
        let child = fork()
        if child == 0 {
            // Only async-signal-safe work here: the id is a struct and the pool refill is one getrandom.
            var id = RequestID()
            _ = withUnsafeBytes(of: &id) { write(fds[1], $0.baseAddress, 16) }
            _exit(0)
        }
        #expect(child > 0)
        close(fds[1])
        let parentsNext = RequestID()
        var childs = RequestID()
        let got = withUnsafeMutableBytes(of: &childs) { read(fds[0], $0.baseAddress, 16) }
        close(fds[0])
        var status: Int32 = 0
        _ = waitpid(child, &status, 0)
        #expect(got == 16)
        #expect(childs != parentsNext)
    }

    @Test func requestIDParseAgreesWithAPlainReadingForEveryByteAtEveryPosition() {
        // The parse is table-driven; here a slow, obvious reading of the same text is the reference (upper-case
        // digits only: a lower-case one is refused).
        func reference(_ bytes: [UInt8]) -> (UInt64, UInt64)? {
            guard bytes.count == 36 else { return nil }
            var digits: [UInt64] = []
            for (i, c) in bytes.enumerated() {
                if [8, 13, 18, 23].contains(i) {
                    if c != UInt8(ascii: "-") { return nil }
                } else if let v = Character(Unicode.Scalar(c)).hexDigitValue, c < 0x80, !(0x61...0x66).contains(c) {
                    digits.append(UInt64(v))
                } else {
                    return nil
                }
            }
            return (digits[0..<16].reduce(0) { $0 << 4 | $1 }, digits[16..<32].reduce(0) { $0 << 4 | $1 })
        }
        let base = Array("6F9619FF-8B86-4011-B42D-00C04FC964FF".utf8)
        var checked = 0
        for position in 0..<36 {
            for byte in 0...255 {
                var bytes = base
                bytes[position] = UInt8(byte)
                let parsed = bytes.withUnsafeBytes { RequestID(uuidBytes: $0) }
                let expected = reference(bytes)
                #expect(parsed.map { [$0.high, $0.low] } == expected.map { [$0.0, $0.1] }, "byte \(byte) at \(position)")
                checked += 1
            }
        }
        #expect(checked == 36 * 256)
        for length in [0, 35, 37] {
            let bytes = Array(repeating: UInt8(ascii: "a"), count: length)
            #expect(bytes.withUnsafeBytes { RequestID(uuidBytes: $0) } == nil)
        }
    }

    @Test func malformedMessagesNameTheProblem() {
        func error(_ v: PlistValue) -> String? {
            do { _ = try Message(plist: v); return nil } catch { return error.detail }
        }
        #expect(error("text") == "message is a string, not a dictionary")
        #expect(error(["id": "x"]) == "message has no string 'type'")
        #expect(error(["type": "begin", "items": []]) == "'begin' needs a string 'id'")
        #expect(error(["type": "begin", "id": "nope", "items": []]) == "'begin' id 'nope' is not a UUID in upper-case 8-4-4-4-12 form")
        #expect(error(["type": "complete", "id": .string(Self.id.uuidString)]) == "'complete' needs an array 'items'")
        #expect(error(["type": "complete", "id": .string(Self.id.uuidString), "items": [["title": 3]]])
            == "item title is a integer, not a string")
        #expect(error(["type": "cancelled", "id": .string(Self.id.uuidString), "error": "x"])
            == "error must be {domain: string, code: integer, message: string}")
    }

    @Test func fileAttachmentsAreNumberedAcrossItemsAndResolvedFromTheFramesDescriptors() throws {
        let a = try FileAttachment(bytes: [1, 2])
        let b = try FileAttachment(bytes: [3])
        let c = try FileAttachment(bytes: [])
        let message = Message.complete(id: Self.id, items: [
            ExtensionItem(title: "x", fileAttachments: [a, b]), ExtensionItem(), ExtensionItem(fileAttachments: [c]),
        ])
        #expect(message.fileAttachments == [a, b, c])
        let plist = message.plist
        #expect(plist["fds"] == 3)
        #expect(plist["items"]?.arrayValue?.map { $0["files"] } == [[0, 1], nil, [2]])
        #expect(try Message.descriptorCount(of: plist) == 3)
        // Decoded against the descriptors its frame brought (here the same objects, as a receiver's would be new).
        let decoded = try Message(plist: plist, files: [a, b, c])
        #expect(decoded == message)
        #expect(try a.readAll() == [1, 2] && b.size == 1 && c.size == 0)
    }

    @Test func badDescriptorClaimsAreMessageErrors() throws {
        let file = try FileAttachment(bytes: [0])
        let base: [String: PlistValue] = ["type": "begin", "id": .string(Self.id.uuidString)]
        var tooMany = base
        tooMany["fds"] = 65
        #expect(throws: MessageError.self) { try Message.descriptorCount(of: .dictionary(tooMany)) }
        var outOfRange = base
        outOfRange["items"] = [["files": [1]]]
        #expect(throws: MessageError.self) { try Message(plist: .dictionary(outOfRange), files: [file]) }
        #expect(throws: MessageError.self) { try Message(plist: Message.ping(seq: 1).plist, files: [file]) }
        var notArray = base
        notArray["items"] = [["files": "0"]]
        #expect(throws: MessageError.self) { try Message(plist: .dictionary(notArray), files: [file]) }
    }
}
