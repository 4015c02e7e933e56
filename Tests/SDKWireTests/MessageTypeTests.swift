// Message type names and keys are declared once (MessageType, MessageKey): every writer and reader spells a
// type or a key through them. These tests tie the rest to them: the static byte names, what each message encodes
// to and decodes from, and the two messages the C launcher writes itself.
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

    @Test func everyStaticKeyIsItsRawValue() {
        for key in MessageKey.allCases {
            let name = key.staticName
            let bytes = UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount)
            #expect(String(decoding: bytes, as: UTF8.self) == key.rawValue)
        }
    }

    @Test func everyMessageEncodesAndDecodesItsType() throws {
        let messages = Self.oneOfEach
        #expect(Set(messages.compactMap(\.type)) == Set(MessageType.allCases), "a type without a message here")
        for message in messages {
            let type = try #require(message.type)
            #expect(message.plist.dictionaryValue?["type"]?.stringValue == type.rawValue)
            #expect(message.typeName == type.rawValue)
            #expect(try Message(plist: message.plist, files: message.fileAttachments).type == type)
        }
        #expect(try Message(plist: ["type": "from-the-future"]).type == nil)
    }

    /// Every key a message, its error or its items write is a `MessageKey`, and every `MessageKey` is written by
    /// some message: a key spelled anywhere else would show up here as one the enum does not know.
    @Test func everyKeyWrittenIsAMessageKeyAndEveryMessageKeyIsWritten() throws {
        var written: Set<String> = []
        func collect(_ value: PlistValue, inItems: Bool) {
            guard case .dictionary(let d) = value else { return }
            for (key, v) in d {
                written.insert(key)
                if key == "items", case .array(let items) = v { for item in items { collect(item, inItems: true) } }
                if key == "error" { collect(v, inItems: false) }
            }
        }
        for message in Self.oneOfEach { collect(message.plist, inItems: false) }
        #expect(written == Set(MessageKey.allCases.map(\.rawValue)))
    }

    static var oneOfEach: [Message] {
        let id = RequestID()
        let file = try! FileAttachment(bytes: [1], name: "k")
        let item = ExtensionItem(title: "t", text: "x", attachments: [1], userInfo: ["k": 1], fileAttachments: [file])
        return [
            .hello(version: 1, identifier: "x", hostPid: 1, idleTimeoutMs: 1), .welcome(version: 1, identifier: "x", pid: 1),
            .begin(id: id, items: [item], extensionID: "x", deadlineMs: 5), .complete(id: id, items: []), .partial(id: id, items: []), .credit(id: id, count: 1),
            .cancel(id: id), .cancelled(id: id, error: .cancelledByHost), .ping(seq: 1), .pong(seq: 1),
            .error(message: "m", id: nil), .connect(version: 1, app: "a"), .connected(version: 1, pid: 1, extensions: [], extensionPoints: ["a": "b"], problems: ["a": "refused r"]),
            .assigned(id: id, pid: 1), .interrupted(id: id, reason: ["kind": "hang"]), .status(seq: 1),
            .statusReport(seq: 1, report: [:]), .sandboxed(layers: [], skipped: [], pid: 3, timings: ["t"]), .launchFailed(reason: "r"),
            .prewarm(id: id, extensionID: "x"), .prewarmed(id: id, pid: 1), .leak(id: id, alive: [], afterMs: 1),
            .subscribe, .event(["kind": "spawned"]),
            .hostCall(id: id, call: 1, service: "s", items: [item]), .hostCallResult(id: id, call: 1, items: [item]),
            .hostCallError(id: id, call: 1, error: .cancelledByHost), .hostCallCancel(id: id, call: 1),
        ]
    }

    @Test func theLaunchersOwnMessagesSpellTheirTypes() throws {
        let source = try #require(readSmallFile("\(packageRoot)/Sources/sdk-host-launcher/main.c"))
        for type in [MessageType.sandboxed, .launchFailed] {
            #expect(source.contains("{.key = \"type\", .string = \"\(type.rawValue)\"}"), "\(type)")
        }
        for key in [MessageKey.type, .reason, .layers, .skipped, .pid, .timings] {
            #expect(source.contains("{.key = \"\(key.rawValue)\","), "\(key)")
        }
        // …and nothing else: every key the launcher writes is one of those.
        var rest = source[...]
        while let at = rest.range(of: ".key = \"") {
            rest = rest[at.upperBound...]
            let key = rest.prefix(while: { $0 != "\"" })
            #expect(MessageKey(rawValue: String(key)) != nil, "the launcher writes a key no MessageKey declares: \(key)")
        }
    }
}
