// `begin`, `complete` and `partial` written field by field. One of them crosses each socket per request in each
// direction, and building its `PlistValue` tree first cost more than encoding it: a hashed dictionary for the
// message and one per item, and the id as a String. Here the same two passes as `BinaryPlistEncoder` (size, then
// store in place) walk the message's fields directly; only `attachments` and `userInfo`, which are already
// `PlistValue`s, go through the generic writer. The bytes are ordinary bplist00 with the keys `Message.plist`
// writes, so any reader (ours, Foundation, plistlib) sees the same message.

/// What the two passes do with each object; `emit` calls them in the same order for both.
protocol FieldSink {
    /// A dictionary (`0xD0`, 2 × count references) or array (`0xA0`, count references) at `index`; returns the
    /// index of its first child.
    mutating func container(_ marker: UInt8, count: Int, references: Int, at index: Int, next: inout Int) -> Int
    mutating func key(_ key: StaticString, at index: Int)
    mutating func string(_ s: String, at index: Int)
    mutating func uuid(_ id: RequestID, at index: Int)
    mutating func value(_ v: PlistValue, at index: Int, next: inout Int)
}

extension EncodedSize: FieldSink {
    mutating func container(_ marker: UInt8, count: Int, references: Int, at index: Int, next: inout Int) -> Int {
        objects += 1
        bytes += headerSize(count)
        self.references += references
        return 0
    }
    mutating func key(_ key: StaticString, at index: Int) {
        objects += 1
        bytes += headerSize(key.utf8CodeUnitCount) + key.utf8CodeUnitCount
    }
    mutating func string(_ s: String, at index: Int) {
        objects += 1
        addString(s)
    }
    mutating func uuid(_ id: RequestID, at index: Int) {
        objects += 1
        bytes += headerSize(36) + 36
    }
    mutating func value(_ v: PlistValue, at index: Int, next: inout Int) { add(v) }
}

extension Writer: FieldSink {
    mutating func container(_ marker: UInt8, count: Int, references: Int, at index: Int, next: inout Int) -> Int {
        storeOffset(of: index)
        let first = next
        next += references
        putHeader(marker, count: count)
        for i in 0..<references { putBigEndian(UInt64(first + i), size: refSize) }
        return first
    }
    mutating func key(_ key: StaticString, at index: Int) {
        storeOffset(of: index)
        putHeader(0x50, count: key.utf8CodeUnitCount)
        putRaw(UnsafeRawBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
    }
    mutating func string(_ s: String, at index: Int) {
        storeOffset(of: index)
        putString(s)
    }
    mutating func uuid(_ id: RequestID, at index: Int) {
        storeOffset(of: index)
        putHeader(0x50, count: 36)
        id.writeUUID(into: UnsafeMutableRawBufferPointer(start: base + cursor, count: 36))
        cursor += 36
    }
    mutating func value(_ v: PlistValue, at index: Int, next: inout Int) { write(v, index: index, next: &next) }
}

extension BinaryPlistEncoder {
    /// Appends the bplist00 payload of an items message without building its `PlistValue`.
    package mutating func encode(_ fields: ItemsFields, appendingTo out: inout [UInt8]) {
        var size = EncodedSize()
        fields.emit(into: &size)
        Self.write(size, appendingTo: &out) { writer in fields.emit(into: &writer) }
    }
}

/// `{type, id, items[, extension][, deadlineMs][, fds]}`, each item `{attachments, userInfo[, title][, text][,
/// files]}` with its files numbered across the message, as `Message.plist` has them.
package struct ItemsFields {
    let type: StaticString
    let id: RequestID
    let items: [ExtensionItem]
    let extensionID: String?
    let deadlineMs: Int64?

    /// The fields of a `begin`, `complete` or `partial`; nil for any other message.
    package init?(_ message: Message) {
        switch message {
        case let .begin(id, items, extensionID, deadlineMs):
            (type, self.id, self.items, self.extensionID, self.deadlineMs) = ("begin", id, items, extensionID, deadlineMs)
        case let .complete(id, items):
            (type, self.id, self.items, extensionID, deadlineMs) = ("complete", id, items, nil, nil)
        case let .partial(id, items):
            (type, self.id, self.items, extensionID, deadlineMs) = ("partial", id, items, nil, nil)
        default:
            return nil
        }
    }

    /// Emits every object; returns how many (the next free index).
    @discardableResult
    func emit<Sink: FieldSink>(into sink: inout Sink) -> Int {
        var files = 0
        for item in items { files += item.fileAttachments.count }
        let n = 3 + (extensionID == nil ? 0 : 1) + (deadlineMs == nil ? 0 : 1) + (files == 0 ? 0 : 1)
        var next = 1
        var key = sink.container(0xD0, count: n, references: 2 * n, at: 0, next: &next)
        var value = key + n
        sink.key("type", at: key)
        sink.key(type, at: value)
        sink.key("id", at: key + 1)
        sink.uuid(id, at: value + 1)
        sink.key("items", at: key + 2)
        let first = sink.container(0xA0, count: items.count, references: items.count, at: value + 2, next: &next)
        key += 3
        value += 3
        var numbered = 0
        for (i, item) in items.enumerated() { emit(item, at: first + i, numberingFilesFrom: &numbered, into: &sink, next: &next) }
        if let extensionID {
            sink.key("extension", at: key)
            sink.string(extensionID, at: value)
            key += 1
            value += 1
        }
        if let deadlineMs {
            sink.key("deadlineMs", at: key)
            sink.value(.integer(deadlineMs), at: value, next: &next)
            key += 1
            value += 1
        }
        if files > 0 {
            sink.key("fds", at: key)
            sink.value(.integer(Int64(files)), at: value, next: &next)
        }
        return next
    }

    private func emit<Sink: FieldSink>(_ item: ExtensionItem, at index: Int, numberingFilesFrom numbered: inout Int,
                                       into sink: inout Sink, next: inout Int)
    {
        let files = item.fileAttachments.count
        let n = 2 + (item.title == nil ? 0 : 1) + (item.text == nil ? 0 : 1) + (files == 0 ? 0 : 1)
        var key = sink.container(0xD0, count: n, references: 2 * n, at: index, next: &next)
        var value = key + n
        sink.key("attachments", at: key)
        sink.value(.array(item.attachments), at: value, next: &next)
        sink.key("userInfo", at: key + 1)
        sink.value(.dictionary(item.userInfo), at: value + 1, next: &next)
        key += 2
        value += 2
        if let title = item.title {
            sink.key("title", at: key)
            sink.string(title, at: value)
            key += 1
            value += 1
        }
        if let text = item.text {
            sink.key("text", at: key)
            sink.string(text, at: value)
            key += 1
            value += 1
        }
        if files > 0 {
            sink.key("files", at: key)
            let first = sink.container(0xA0, count: files, references: files, at: value, next: &next)
            for j in 0..<files { sink.value(.integer(Int64(numbered + j)), at: first + j, next: &next) }
            numbered += files
        }
    }
}
