// `begin`, `complete` and `partial` are written field by field (ItemsMessageEncoding.swift), not through
// `Message.plist`. The bytes must be the frame of the same message for our decoder and for an independent reader,
// and must size themselves exactly (the encoder traps if its two passes disagree).
import Foundation
import HostTestSupport
@testable import SDKWire
import SDKWireFoundation
import Testing

@Suite struct ItemsMessageEncodingTests {
    static func item(_ g: inout SeededGenerator, files: [FileAttachment]) -> ExtensionItem {
        var userInfo: [String: PlistValue] = [:]
        for _ in 0..<Int.random(in: 0..<8, using: &g) { userInfo[RandomPlist.string(&g)] = RandomPlist.value(&g) }
        return ExtensionItem(
            title: Bool.random(using: &g) ? RandomPlist.string(&g) : nil,
            text: Bool.random(using: &g) ? RandomPlist.string(&g) : nil,
            attachments: (0..<Int.random(in: 0..<4, using: &g)).map { _ in RandomPlist.value(&g) },
            userInfo: userInfo,
            fileAttachments: Array(files.prefix(Int.random(in: 0...files.count, using: &g))))
    }

    static func message(_ g: inout SeededGenerator, files: [FileAttachment]) -> Message {
        // Up to 20 items, so the items array's header also takes its long form (15 and more).
        let items = (0..<Int.random(in: 0..<(Bool.random(using: &g) ? 3 : 20), using: &g)).map { _ in item(&g, files: files) }
        switch Int.random(in: 0..<3, using: &g) {
        case 0:
            return .begin(id: RequestID(), items: items,
                          extensionID: Bool.random(using: &g) ? RandomPlist.string(&g) : nil,
                          deadlineMs: Bool.random(using: &g) ? RandomPlist.integer(&g) : nil)
        case 1: return .complete(id: RequestID(), items: items)
        default: return .partial(id: RequestID(), items: items)
        }
    }

    @Test func fieldByFieldFramesAreTheFramesOfTheSameMessages() throws {
        let seed = testSeed(default: 0x17E5)
        var g = SeededGenerator(seed: seed)
        let files = try (0..<3).map { try FileAttachment(bytes: [UInt8($0)]) }
        for i in 0..<1_000 {
            let message = Self.message(&g, files: files)
            var bytes: [UInt8] = [0xEE]
            var outgoing = OutgoingDescriptors()
            var encoder = BinaryPlistEncoder()
            try outgoing.encode(message, with: &encoder, appendingTo: &bytes)
            #expect(bytes[0] == 0xEE)
            let length = Int(bytes[1]) << 24 | Int(bytes[2]) << 16 | Int(bytes[3]) << 8 | Int(bytes[4])
            #expect(length == bytes.count - 5, "case \(i), seed \(seed)")
            let payload = Array(bytes[5...])
            let plist = try BinaryPlistDecoder.decode(payload)
            #expect(plist == message.plist, "case \(i), seed \(seed)")
            #expect(try Message(plist: plist, files: message.fileAttachments) == message, "case \(i), seed \(seed)")
            // The frame still carries the message's descriptors.
            #expect(outgoing.nextWrite(from: 1, upTo: bytes.count).descriptors.count == message.fileAttachments.count)
        }
    }

    @Test func foundationReadsAFieldByFieldBegin() throws {
        let item = ExtensionItem(title: "Analytics event", text: "héllo 日本", attachments: ["screen_view", .data([1, 2])],
                                 userInfo: ["screen": "Checkout", "retries": 3, "ratio": 0.75])
        let message = Message.begin(id: RequestID(), items: [item, ExtensionItem()], extensionID: "com.example.echo",
                                    deadlineMs: 30_000)
        var payload: [UInt8] = []
        var encoder = BinaryPlistEncoder()
        encoder.encode(ItemsFields(message)!, appendingTo: &payload)
        let foundation = try PropertyListSerialization.propertyList(from: Data(payload), options: [], format: nil)
        #expect(try PlistFoundation.value(from: foundation, path: "begin") == message.plist)
    }

    @Test func onlyItemsMessagesTakeTheFieldPath() throws {
        #expect(ItemsFields(.ping(seq: 1)) == nil)
        #expect(ItemsFields(.cancel(id: RequestID())) == nil)
        // Any other message after an items message is its own frame, and nothing is written between them.
        var bytes: [UInt8] = []
        var outgoing = OutgoingDescriptors()
        var encoder = BinaryPlistEncoder()
        try outgoing.encode(.complete(id: RequestID(), items: [ExtensionItem(title: "a")]), with: &encoder, appendingTo: &bytes)
        try outgoing.encode(.ping(seq: 7), with: &encoder, appendingTo: &bytes)
        var reader = FrameReader()
        reader.append(contentsOf: bytes)
        #expect(try reader.nextValue()?["type"] == "complete")
        #expect(try reader.nextValue() == Message.ping(seq: 7).plist)
        #expect(try reader.nextValue() == nil)
    }

    /// A dictionary written field by field (the launcher's profile) is the dictionary of the same values, for our
    /// decoder and for Foundation's: UTF-16 strings, long and empty lists, integers of every width, Booleans.
    @Test func aDictionaryWrittenFieldByFieldIsTheSameDictionary() throws {
        let long = (0..<20).map { "/path/\($0)" }
        let fields: [(StaticString, FieldValue)] = [
            ("Name", .string("naïve ☃")), ("Empty", .strings([])), ("Long", .strings(long)), ("Short", .strings(["a", "日本"])),
            ("Small", .integer(7)), ("Wide", .integer(1 << 40)), ("Negative", .integer(-3)), ("Yes", .bool(true)),
            ("No", .bool(false)), ("Blank", .string("")),
        ]
        var bytes: [UInt8] = [9]
        BinaryPlistEncoder.encode(fields: fields, appendingTo: &bytes)
        #expect(bytes[0] == 9)
        let payload = Array(bytes.dropFirst())
        let expected: PlistValue = .dictionary([
            "Name": .string("naïve ☃"), "Empty": .array([]), "Long": .array(long.map(PlistValue.string)),
            "Short": .array([.string("a"), .string("日本")]), "Small": .integer(7), "Wide": .integer(1 << 40),
            "Negative": .integer(-3), "Yes": .bool(true), "No": .bool(false), "Blank": .string(""),
        ])
        #expect(try BinaryPlistDecoder.decode(payload) == expected)
        let foundation = try PropertyListSerialization.propertyList(from: Data(payload), options: [], format: nil)
        #expect(try PlistFoundation.value(from: foundation, path: "fields") == expected)
    }
}
