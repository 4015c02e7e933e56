// FlatFrame: `assigned`, `cancel` and `credit` are written straight from their fields. The bytes must be a frame
// of the same message for our decoder and for an independent reader (Foundation's PropertyListSerialization).
import Foundation
import HostTestSupport
@testable import SDKWire
import SDKWireFoundation
import Testing

@Suite struct FlatFrameTests {
    static let integers: [Int64] = [0, 1, 14, 15, 255, 256, 65_535, 65_536, 4_294_967_295, 4_294_967_296, .max, -1, .min]

    func messages(_ g: inout SeededGenerator) -> [Message] {
        let id = RequestID()
        let n = Self.integers.randomElement(using: &g)!
        return [.assigned(id: id, pid: Int32(truncatingIfNeeded: n)), .cancel(id: id), .credit(id: id, count: n)]
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
        FlatFrame.appendPayload(FlatFrame.entries(of: message)!, to: &payload)
        return payload
    }

    @Test func aFlatPayloadIsReadBackWithoutTheDecoder() throws {
        var g = SeededGenerator(seed: testSeed(default: 0xF1A8))
        for _ in 0..<200 {
            for message in messages(&g) {
                let payload = flatPayload(message)
                #expect(payload.withUnsafeBytes { FlatFrame.message(from: $0) } == message)
            }
        }
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
        #expect(try Message(plist: BinaryPlistDecoder.decode(lower)) == .cancel(id: id))
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
