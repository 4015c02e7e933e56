// Message type names are declared once (MessageType): every writer and reader spells a type through it. These
// tests tie the rest to it: the static byte names, what each message encodes to and decodes from, and the two
// the C launcher writes itself.
import SDKWire
import HostTestSupport
import Testing

@Suite struct MessageTypeTests {
    @Test func everyStaticNameIsItsRawValue() {
        for type in MessageType.allCases {
            let name = type.staticName
            let bytes = UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount)
            #expect(String(decoding: bytes, as: UTF8.self) == type.rawValue)
        }
    }

    @Test func everyMessageEncodesAndDecodesItsType() throws {
        let id = RequestID()
        let messages: [Message] = [
            .hello(version: 1, identifier: "x", hostPid: 1, idleTimeoutMs: 1), .welcome(version: 1, identifier: "x", pid: 1),
            .begin(id: id, items: []), .complete(id: id, items: []), .partial(id: id, items: []), .credit(id: id, count: 1),
            .cancel(id: id), .cancelled(id: id, error: .cancelledByHost), .ping(seq: 1), .pong(seq: 1),
            .error(message: "m", id: nil), .connect(version: 1), .connected(version: 1, pid: 1, extensions: []),
            .assigned(id: id, pid: 1), .interrupted(id: id, reason: ["kind": "hang"]), .status(seq: 1),
            .statusReport(seq: 1, report: [:]), .sandboxed(layers: [], skipped: []), .launchFailed(reason: "r"),
            .prewarm(id: id, extensionID: "x"), .prewarmed(id: id, pid: 1), .leak(id: id, alive: [], afterMs: 1),
            .subscribe, .event(["kind": "spawned"]),
        ]
        #expect(Set(messages.compactMap(\.type)) == Set(MessageType.allCases), "a type without a message here")
        for message in messages {
            let type = try #require(message.type)
            #expect(message.plist.dictionaryValue?["type"]?.stringValue == type.rawValue)
            #expect(message.typeName == type.rawValue)
            #expect(try Message(plist: message.plist).type == type)
        }
        #expect(try Message(plist: ["type": "from-the-future"]).type == nil)
    }

    @Test func theLaunchersOwnMessagesSpellTheirTypes() throws {
        let source = try #require(readSmallFile("\(packageRoot)/Sources/sdk-host-launcher/main.c"))
        for type in [MessageType.sandboxed, .launchFailed] {
            #expect(source.contains("{.key = \"type\", .string = \"\(type.rawValue)\"}"), "\(type)")
        }
    }
}
