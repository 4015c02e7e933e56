// FlatFrame: the flat messages (every value a string or an integer) are written straight from their fields and
// read back without the decoder. The bytes must be a frame of the same message for our decoder and for an
// independent reader (Foundation's PropertyListSerialization), and the fast reading must take exactly what the
// decoder would read as the same message.
import Foundation
import HostTestSupport
@testable import SDKWire
import SDKWireFoundation
import Testing

@Suite struct FlatFrameTests {
    static let integers: [Int64] = [0, 1, 14, 15, 255, 256, 65_535, 65_536, 4_294_967_295, 4_294_967_296, .max, -1, .min]

    /// Strings a flat message may carry: empty, short, at 15 bytes (the longer header), long enough that the
    /// payload passes 255 bytes (wider offsets: left to the decoder), and not ASCII (UTF-16: left to the decoder).
    static let strings = ["", "com.example.echo", "fifteen-bytes!!", String(repeating: "x", count: 300), "naïve ☃", "a\u{0}b"]

    func messages(_ g: inout SeededGenerator) -> [Message] {
        let id = RequestID()
        let n = Self.integers.randomElement(using: &g)!
        let s = Self.strings.randomElement(using: &g)!
        let pid = Int32(truncatingIfNeeded: n)
        return [.assigned(id: id, pid: pid), .cancel(id: id), .credit(id: id, count: n), .ping(seq: n), .pong(seq: n),
                .hello(version: n, identifier: s, hostPid: pid, idleTimeoutMs: n), .welcome(version: n, identifier: s, pid: pid),
                .error(message: s, id: id), .error(message: s, id: nil), .connect(version: n, app: s), .connect(version: n, app: nil),
                .prewarm(id: id, extensionID: s), .prewarmed(id: id, pid: pid), .subscribe, .launchFailed(reason: s),
                .status(seq: n), .hostCallCancel(id: id, call: n), .unknown(type: s.isEmpty ? "later" : s),
                // With a table of strings and integers, or a list of strings.
                .cancelled(id: id, error: ExtensionError(domain: s, code: n, message: "cancelled")),
                .interrupted(id: id, reason: ["kind": "signal", "code": .integer(n)]),
                .interrupted(id: id, reason: ["kind": "protocol", "detail": .string(s)]), .interrupted(id: id, reason: [:]),
                .connected(version: n, pid: pid, extensions: [s, "com.example.echo"], extensionPoints: ["com.sdk-host.service": s]),
                .connected(version: n, pid: pid, extensions: [], extensionPoints: [:]),
                .connected(version: n, pid: pid, extensions: [s], extensionPoints: [s: "p"], problems: [s: "refused \(s)"])]
    }

    /// Whether every string of the fields, keys of tables included, is ASCII.
    static func allASCII(_ fields: FlatFields) -> Bool {
        func ascii(_ s: String) -> Bool { s.utf8.allSatisfy { $0 < 0x80 } }
        return fields.allSatisfy { field in
            switch field.value {
            case .string(let s): ascii(s)
            case .strings(let list): list.allSatisfy(ascii)
            case .table(let entries):
                entries.allSatisfy { entry in
                    if case .string(let s) = entry.value { ascii(entry.key) && ascii(s) } else { ascii(entry.key) }
                }
            case .type, .id, .integer: true
            }
        }
    }

    @Test func everyKeyAndTypeIsReadFromItsBytes() {
        for key in MessageKey.allCases {
            #expect(Array(key.rawValue.utf8).withUnsafeBytes { MessageKey(ascii: $0) } == key)
            #expect(Array((key.rawValue + "x").utf8).withUnsafeBytes { MessageKey(ascii: $0) } == nil)
        }
        for type in MessageType.allCases { #expect(Array(type.rawValue.utf8).withUnsafeBytes { MessageType(ascii: $0) } == type) }
        #expect(Array("Type".utf8).withUnsafeBytes { MessageKey(ascii: $0) } == nil)
    }

    @Test func everyMessageWithOnlyStringsAndIntegersIsFlat() throws {
        var g = SeededGenerator(seed: testSeed(default: 0xF1A6))
        let flat = Set(messages(&g).map(\.typeName))
        // The others carry items, a report, or lists and dictionaries of other shapes.
        let notFlat: Set<MessageType> = [.begin, .complete, .partial, .event, .sandboxed, .statusReport, .leak, .hostCall,
                                         .hostCallResult, .hostCallError]
        for type in MessageType.allCases {
            #expect(flat.contains(type.rawValue) != notFlat.contains(type), "\(type)")
            // The reader declines the others by their type before reading their fields.
            #expect(type.isFlat != notFlat.contains(type), "\(type)")
        }
        // An interruption whose reason is not a table of strings and integers is written through the general encoder.
        let id = RequestID()
        #expect(Message.interrupted(id: id, reason: ["kind": "x", "list": .array([])]).flatFields == nil)
        #expect(Message.interrupted(id: id, reason: ["kind": .bool(true)]).flatFields == nil)
        #expect(Message.interrupted(id: id, reason: "signal").flatFields == nil)
        let nested = Message.interrupted(id: id, reason: ["kind": "x", "more": ["a": 1]])
        #expect(try Message(plist: BinaryPlistDecoder.decode(BinaryPlistEncoder.encode(nested.plist))) == nested)
    }

    @Test func flatMessagesAreTheFramesOfTheSameMessages() throws {
        var g = SeededGenerator(seed: testSeed(default: 0xF1A7))
        for _ in 0..<200 {
            for message in messages(&g) {
                var bytes: [UInt8] = [0xEE]  // appended after what is already there
                var outgoing = OutgoingDescriptors()
                var encoder = BinaryPlistEncoder()
                try outgoing.encode(message, with: &encoder, appendingTo: &bytes)
                #expect(bytes[0] == 0xEE)
                let length = Int(bytes[1]) << 24 | Int(bytes[2]) << 16 | Int(bytes[3]) << 8 | Int(bytes[4])
                #expect(length == bytes.count - 5)
                let payload = Array(bytes[5...])
                let plist = try BinaryPlistDecoder.decode(payload)
                #expect(try Message(plist: plist) == message)
                #expect(plist == message.plist)
                // An independent reader sees the same dictionary.
                let foundation = try PropertyListSerialization.propertyList(from: Data(payload), options: [], format: nil)
                #expect(try PlistFoundation.value(from: foundation, path: "flat") == message.plist)
            }
        }
    }

    func flatPayload(_ message: Message) -> [UInt8] {
        var payload: [UInt8] = []
        _ = FlatFrame.appendPayload(message.flatFields!, to: &payload)
        return payload
    }

    @Test func aFlatPayloadIsReadBackWithoutTheDecoder() throws {
        var g = SeededGenerator(seed: testSeed(default: 0xF1A8))
        var taken = 0
        for _ in 0..<200 {
            for message in messages(&g) {
                let payload = flatPayload(message)
                let fast = payload.withUnsafeBytes { FlatFrame.message(from: $0) }
                // Only a payload over 255 bytes or with a string that is not ASCII is left to the decoder.
                let ascii = Self.allASCII(message.flatFields!)
                let plain = payload.count < 256 && ascii && message.type != nil  // an unknown type: the decoder's
                #expect(fast == (plain ? message : nil), "\(message)")
                if fast != nil { taken += 1 }
            }
        }
        #expect(taken > 1000)
    }

    /// Bytes changed anywhere, or cut short: the fast reading either declines (and the decoder has the frame) or
    /// returns exactly what the decoder makes of the same bytes. It never traps.
    @Test func aChangedFlatPayloadIsEitherDeclinedOrReadAsTheDecoderReadsIt() throws {
        var g = SeededGenerator(seed: testSeed(default: 0xF1A9))
        var declined = 0, taken = 0
        for _ in 0..<3000 {
            var payload = flatPayload(messages(&g).randomElement(using: &g)!)
            for _ in 0..<Int.random(in: 1...3, using: &g) {
                payload[Int.random(in: 0..<payload.count, using: &g)] = UInt8.random(in: 0...255, using: &g)
            }
            if Bool.random(using: &g) && Int.random(in: 0..<4, using: &g) == 0 { payload.removeLast(Int.random(in: 1...8, using: &g)) }
            guard let fast = payload.withUnsafeBytes({ FlatFrame.message(from: $0) }) else {
                declined += 1
                continue
            }
            taken += 1
            #expect(try Message(plist: BinaryPlistDecoder.decode(payload)) == fast)
        }
        #expect(declined > 0 && taken > 0)
    }

    @Test func theSameMessageInAnotherWritersLayoutIsLeftToTheDecoder() throws {
        let id = RequestID()
        // Our general encoder (dictionary order, its own offsets), and the id in lower case.
        let general = BinaryPlistEncoder.encode(Message.assigned(id: id, pid: 42).plist)
        if let fast = general.withUnsafeBytes({ FlatFrame.message(from: $0) }) { #expect(fast == .assigned(id: id, pid: 42)) }
        var lower = flatPayload(.cancel(id: id))
        let upper = Array(id.uuidString.utf8)
        let at = try #require(lower.indices.first { Array(lower[$0..<min($0 + 36, lower.count)]) == upper })
        for i in at..<at + 36 where lower[i] >= UInt8(ascii: "A") && lower[i] <= UInt8(ascii: "F") { lower[i] |= 0x20 }
        #expect(lower != flatPayload(.cancel(id: id)))
        #expect(lower.withUnsafeBytes { FlatFrame.message(from: $0) } == nil)
        // A lower-case id is refused by the decoder too: the answer would come under the upper-case form.
        #expect(throws: MessageError.self) { try Message(plist: BinaryPlistDecoder.decode(lower)) }
    }

    /// Layouts our writer never makes for the message the fields would read as: a key twice, keys in another
    /// order, a pid past Int32 (which hello truncates and welcome refuses). The fast reading declines each, and
    /// the decoder has the last word.
    @Test func fieldsOurWriterWouldNotWriteAreLeftToTheDecoder() throws {
        func payload(_ fields: [(MessageKey, FlatValue)]) -> [UInt8] {
            var out: [UInt8] = []
            _ = FlatFrame.appendPayload(fields.map { FlatField($0.0, $0.1) }, to: &out)
            return out
        }
        func fast(_ bytes: [UInt8]) -> Message? { bytes.withUnsafeBytes { FlatFrame.message(from: $0) } }
        let twice = payload([(.type, .type(.ping)), (.seq, .integer(1)), (.seq, .integer(1))])
        #expect(fast(twice) == nil)
        let swapped = payload([(.seq, .integer(7)), (.type, .type(.ping))])
        #expect(fast(swapped) == nil)
        #expect(try Message(plist: BinaryPlistDecoder.decode(swapped)) == .ping(seq: 7))
        let wide = payload([(.type, .type(.hello)), (.version, .integer(2)), (.identifier, .string("x")),
                            (.hostPid, .integer(1 << 32 | 5)), (.idleTimeoutMs, .integer(0))])
        #expect(fast(wide) == nil)
        #expect(try Message(plist: BinaryPlistDecoder.decode(wide)) == .hello(version: 2, identifier: "x", hostPid: 5, idleTimeoutMs: 0))
        let outOfRange = payload([(.type, .type(.welcome)), (.version, .integer(2)), (.identifier, .string("x")),
                                  (.pid, .integer(1 << 31))])
        #expect(fast(outOfRange) == nil)
        #expect(throws: MessageError.self) { try Message(plist: BinaryPlistDecoder.decode(outOfRange)) }
        let unknownKey = payload([(.type, .type(.ping)), (.seq, .integer(1)), (.app, .string("a"))])
        #expect(fast(unknownKey) == nil)
        #expect(try Message(plist: BinaryPlistDecoder.decode(unknownKey)) == .ping(seq: 1))
        // The writer's own layout of the same messages is taken.
        #expect(fast(payload([(.type, .type(.ping)), (.seq, .integer(7))])) == .ping(seq: 7))
    }

    @Test func aFlatFrameOverTheLimitIsRefusedAndNothingIsAppended() {
        var bytes: [UInt8] = [1, 2, 3]
        var outgoing = OutgoingDescriptors()
        var encoder = BinaryPlistEncoder()
        #expect(throws: WireError.self) {
            try outgoing.encode(.cancel(id: RequestID()), with: &encoder, appendingTo: &bytes,
                                limits: WireLimits(maxFrameBytes: 40))
        }
        #expect(bytes == [1, 2, 3])
    }
}
