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
