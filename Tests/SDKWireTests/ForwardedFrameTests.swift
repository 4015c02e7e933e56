// ForwardedFrame: the daemon sends a client's begin (and a worker's complete) on byte for byte, rewriting only
// the request id. Finding the id must work for every payload our encoder writes, refuse what it cannot rewrite in
// place, and never read out of bounds, whatever the bytes.
import HostTestSupport
@testable import SDKWire
import Testing

@Suite struct ForwardedFrameTests {
    func payload(_ message: Message) throws -> [UInt8] {
        Array(try Frame.encode(message.plist).dropFirst(Frame.headerSize))
    }

    @Test func rewritesTheIdAndNothingElse() throws {
        var g = SeededGenerator(seed: testSeed(default: 4242))
        for round in 0..<300 {
            // Items of every shape, and enough userInfo keys that the top dictionary's layout varies.
            let items = (0..<Int.random(in: 0..<4, using: &g)).map { _ in
                ExtensionItem(title: Bool.random(using: &g) ? RandomPlist.string(&g) : nil,
                              attachments: [RandomPlist.value(&g)],
                              userInfo: ["k\(Int.random(in: 0..<99, using: &g))": RandomPlist.value(&g)])
            }
            let original = RequestID(), replacement = RequestID()
            let message: Message = round % 2 == 0
                ? .begin(id: original, items: items, extensionID: "com.example.echo", deadlineMs: Int64(round))
                : .complete(id: original, items: items)
            let bytes = try payload(message)
            let range = try #require(bytes.withUnsafeBytes { ForwardedFrame.idRange(in: $0) }, "round \(round)")
            var rewritten = bytes
            ForwardedFrame.write(replacement, into: &rewritten, at: range)
            let decoded = try Message(plist: BinaryPlistDecoder.decode(rewritten))
            let expected: Message = round % 2 == 0
                ? .begin(id: replacement, items: items, extensionID: "com.example.echo", deadlineMs: Int64(round))
                : .complete(id: replacement, items: items)
            #expect(decoded == expected, "round \(round)")
            // Outside the id, the bytes are the sender's.
            #expect(Array(rewritten[..<range.lowerBound]) == Array(bytes[..<range.lowerBound]))
            #expect(Array(rewritten[range.upperBound...]) == Array(bytes[range.upperBound...]))
        }
    }

    @Test func anIdItCannotRewriteInPlaceIsRefused() throws {
        // The id as a UTF-16 string (valid bplist, decodes to the same message) or an integer: encode again.
        let id = RequestID()
        let canonical = try payload(.complete(id: id, items: []))
        var asUTF16 = PlistValue.dictionary(["type": "complete", "id": .string(id.uuidString + "é"), "items": .array([])])
        let viaUTF16 = Array(try Frame.encode(asUTF16).dropFirst(4))
        #expect(viaUTF16.withUnsafeBytes { ForwardedFrame.idRange(in: $0) } == nil)
        asUTF16 = .dictionary(["type": "complete", "id": .integer(7), "items": .array([])])
        #expect(Array(try Frame.encode(asUTF16).dropFirst(4)).withUnsafeBytes { ForwardedFrame.idRange(in: $0) } == nil)
        #expect(canonical.withUnsafeBytes { ForwardedFrame.idRange(in: $0) } != nil)
        // No "id" key at all, or not a dictionary at the top.
        let noID = Array(try Frame.encode(.dictionary(["type": "ping", "seq": 1])).dropFirst(4))
        #expect(noID.withUnsafeBytes { ForwardedFrame.idRange(in: $0) } == nil)
        let array = Array(try Frame.encode(.array(["id", .string(id.uuidString)])).dropFirst(4))
        #expect(array.withUnsafeBytes { ForwardedFrame.idRange(in: $0) } == nil)
    }

    @Test func anIdKeyInAnotherFormIsNeverMissed() throws {
        // Two "id" keys: the short ASCII one first, then "id" as UTF-16, or as ASCII with its length given as an
        // integer. A decoder reads the last; rewriting the first would send on a frame whose id, as the receiver
        // reads it, is another request's (the peer's own choice).
        let first = RequestID(), last = RequestID()
        func uuid(_ id: RequestID) -> [UInt8] { [0x5F, 0x10, 36] + Array(id.uuidString.utf8) }
        for lastKey: [UInt8] in [[0x62, 0, 0x69, 0, 0x64], [0x5F, 0x10, 2, 0x69, 0x64]] {
            let bytes = handBuilt(objects: [
                [0xD4, 1, 2, 3, 4, 5, 6, 7, 8],  // {type, id, items, id}: keys 1-4, values 5-8
                [0x54] + Array("type".utf8), [0x52] + Array("id".utf8), [0x55] + Array("items".utf8), lastKey,
                [0x58] + Array("complete".utf8), uuid(first), [0xA0], uuid(last),
            ])
            #expect(try Message(plist: BinaryPlistDecoder.decode(bytes)) == .complete(id: last, items: []))
            #expect(bytes.withUnsafeBytes { ForwardedFrame.idRange(in: $0) } == nil, "\(lastKey)")
        }
    }

    @Test func anIdThatAnotherObjectOverlapsIsNotRewrittenInPlace() throws {
        // A decoder lets objects overlap. Object 8 starts at the id's first character ('3', read as a date's
        // marker): the id rewritten in place, the receiver would read another date there, or no date at all.
        let id = try #require(RequestID(uuidString: "30000000-0000-4000-8000-000000000001"))
        let objects: [[UInt8]] = [
            [0xD4, 1, 2, 3, 4, 5, 6, 7, 8],  // {type, id, items, extra}: keys 1-4, values 5-8
            [0x54] + Array("type".utf8), [0x52] + Array("id".utf8), [0x55] + Array("items".utf8),
            [0x55] + Array("extra".utf8), [0x58] + Array("complete".utf8),
            [0x5F, 0x10, 36] + Array(id.uuidString.utf8), [0xA0], [],
        ]
        var offsets: [Int] = []
        var at = 8
        for object in objects.dropLast() {
            offsets.append(at)
            at += object.count
        }
        offsets.append(offsets[6] + 3)
        let bytes = handBuilt(objects: objects, offsetsOverride: offsets)
        let decoded = try BinaryPlistDecoder.decode(bytes)
        guard case .date? = decoded["extra"] else {
            Issue.record("the overlapping object does not read as a date: \(decoded)")
            return
        }
        #expect(try Message(plist: decoded) == .complete(id: id, items: []))
        #expect(bytes.withUnsafeBytes { ForwardedFrame.idRange(in: $0) } == nil)
        #expect(bytes.withUnsafeBytes { ForwardScan.scan($0, limits: .default) } == nil)
        // Laid out without the overlap, the same message is forwardable.
        let apart = handBuilt(objects: Array(objects.dropLast()) + [[0x33] + [UInt8](repeating: 0, count: 8)])
        #expect(apart.withUnsafeBytes { ForwardedFrame.idRange(in: $0) } != nil)
        #expect(apart.withUnsafeBytes { ForwardScan.scan($0, limits: .default) } != nil)
    }

    /// New ids are random version-4 UUIDs (128 bits from one getrandom call), or the daemon's `distinct()` ones:
    /// distinct and well-formed on the wire.
    @Test(arguments: [false, true])
    func newRequestIDsAreDistinctVersion4UUIDs(distinct: Bool) {
        var seen = Set<RequestID>()
        for _ in 0..<20_000 {
            let id = distinct ? RequestID.distinct() : RequestID()
            let text = id.uuidString
            #expect(Array(text.utf8)[14] == UInt8(ascii: "4"))
            #expect("89AB".utf8.contains(Array(text.utf8)[19]))
            #expect(RequestID(uuidString: text) == id)
            seen.insert(id)
        }
        #expect(seen.count == 20_000)
    }

    @Test func hostileBytesNeverReadOutOfBounds() throws {
        var g = SeededGenerator(seed: testSeed(default: 977))
        let valid = try payload(.begin(id: RequestID(), items: [ExtensionItem(title: "t", userInfo: ["a": 1])],
                                        extensionID: "x", deadlineMs: nil))
        for _ in 0..<20_000 {
            var bytes = valid
            switch Int.random(in: 0..<3, using: &g) {
            case 0:  // flip bytes anywhere, the trailer and offset table included
                for _ in 0..<Int.random(in: 1...6, using: &g) {
                    bytes[Int.random(in: 0..<bytes.count, using: &g)] = UInt8.random(in: 0...255, using: &g)
                }
            case 1:  // cut short
                bytes = Array(bytes.prefix(Int.random(in: 0..<bytes.count, using: &g)))
            default:  // random noise with a bplist magic
                bytes = Array("bplist00".utf8) + (0..<Int.random(in: 0..<200, using: &g)).map { _ in UInt8.random(in: 0...255, using: &g) }
            }
            // The answer is either nil or 36 bytes inside the payload, before its trailer, and they are the id a
            // decoder reads.
            if let range = bytes.withUnsafeBytes({ ForwardedFrame.idRange(in: $0) }) {
                #expect(range.count == 36 && range.lowerBound >= 0 && range.upperBound <= bytes.count - 32)
                if let decoded = try? BinaryPlistDecoder.decode(bytes) {
                    #expect(decoded["id"]?.stringValue == String(decoding: bytes[range], as: UTF8.self))
                    // Rewritten, it still decodes, and with the new id.
                    let replacement = RequestID()
                    var rewritten = bytes
                    ForwardedFrame.write(replacement, into: &rewritten, at: range)
                    let reread = try? BinaryPlistDecoder.decode(rewritten)
                    #expect(reread?["id"]?.stringValue == replacement.uuidString)
                }
            }
        }
    }
}
