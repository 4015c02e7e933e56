// `begin`, `complete` and `partial` written field by field. One of them crosses each socket per request in each
// direction, and building its `PlistValue` tree first cost more than encoding it: a hashed dictionary for the
// message and one per item, and the id as a String. Here the same two passes as `BinaryPlistEncoder` (size, then
// store in place) walk the message's fields directly; only `attachments` and `userInfo`, which are already
// `PlistValue`s, go through the generic writer. The bytes are ordinary bplist00 with the keys `Message.plist`
// writes, so any reader (ours, Foundation, plistlib) sees the same message. `FlatFrame` emits the flat messages
// (`ping`, `pong`, `assigned`, `cancel`, ...) through the same `FieldSink`.

/// What the two passes do with each object; `emit` calls them in the same order for both.
protocol FieldSink {
    /// A dictionary (`0xD0`, 2 × count references) or array (`0xA0`, count references) at `index`; returns the
    /// index of its first child.
    mutating func container(_ marker: UInt8, count: Int, references: Int, at index: Int, next: inout Int) -> Int
    /// An ASCII string known when the program is built: a key, or a value such as a message's type.
    mutating func ascii(_ s: StaticString, at index: Int)
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
    mutating func ascii(_ s: StaticString, at index: Int) {
        objects += 1
        bytes += headerSize(s.utf8CodeUnitCount) + s.utf8CodeUnitCount
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
    mutating func ascii(_ s: StaticString, at index: Int) {
        storeOffset(of: index)
        putHeader(0x50, count: s.utf8CodeUnitCount)
        putRaw(UnsafeRawBufferPointer(start: s.utf8Start, count: s.utf8CodeUnitCount))
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

extension FieldSink {
    /// A dictionary of `count` entries at `index`, its keys and values to be emitted through the slots returned.
    mutating func dictionary(count: Int, at index: Int, next: inout Int) -> DictionarySlots {
        DictionarySlots(first: container(0xD0, count: count, references: 2 * count, at: index, next: &next), count: count)
    }
}

/// Where a dictionary's entries go: keys take `first..<first+count`, values `first+count..<first+2*count`.
struct DictionarySlots {
    let first: Int
    let count: Int
    private var emitted = 0

    init(first: Int, count: Int) {
        self.first = first
        self.count = count
    }

    /// Emits `key` as the next entry's key; returns the index its value takes.
    mutating func next<Sink: FieldSink>(_ key: MessageKey, in sink: inout Sink) -> Int {
        sink.ascii(key.staticName, at: first + emitted)
        defer { emitted += 1 }
        return first + count + emitted
    }
}

extension BinaryPlistEncoder {
    /// Appends the bplist00 payload of a message emitted field by field, without building its `PlistValue`.
    /// Over `limit` bytes nothing is appended and the size is returned (as `write`).
    @discardableResult
    static func encodeFields(appendingTo out: inout [UInt8], limit: Int = .max, _ emit: (inout EncodedSize) -> Int,
                             _ emitAgain: (inout Writer) -> Int) -> Int?
    {
        var size = EncodedSize()
        _ = emit(&size)
        return write(size, appendingTo: &out, limit: limit, emitAgain)
    }

    /// Appends the bplist00 payload of an items message without building its `PlistValue`; over `limit` bytes,
    /// nothing, and returns the size it would take.
    @discardableResult
    package mutating func encode(_ fields: ItemsFields, appendingTo out: inout [UInt8], limit: Int = .max) -> Int? {
        Self.encodeFields(appendingTo: &out, limit: limit, { fields.emit(into: &$0) }, { fields.emit(into: &$0) })
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
            (type, self.id, self.items, self.extensionID, self.deadlineMs) = (MessageType.begin.staticName, id, items, extensionID, deadlineMs)
        case let .complete(id, items):
            (type, self.id, self.items, extensionID, deadlineMs) = (MessageType.complete.staticName, id, items, nil, nil)
        case let .partial(id, items):
            (type, self.id, self.items, extensionID, deadlineMs) = (MessageType.partial.staticName, id, items, nil, nil)
        default:
            return nil
        }
    }

    /// Emits every object; returns how many (the next free index).
    func emit<Sink: FieldSink>(into sink: inout Sink) -> Int {
        var files = 0
        for item in items { files += item.fileAttachments.count }
        var next = 1
        var top = sink.dictionary(count: 3 + (extensionID == nil ? 0 : 1) + (deadlineMs == nil ? 0 : 1) + (files == 0 ? 0 : 1),
                                  at: 0, next: &next)
        var at = top.next(.type, in: &sink)
        sink.ascii(type, at: at)
        at = top.next(.id, in: &sink)
        sink.uuid(id, at: at)
        at = top.next(.items, in: &sink)
        let first = sink.container(0xA0, count: items.count, references: items.count, at: at, next: &next)
        var numbered = 0
        for (i, item) in items.enumerated() { emit(item, at: first + i, numberingFilesFrom: &numbered, into: &sink, next: &next) }
        if let extensionID {
            at = top.next(.`extension`, in: &sink)
            sink.string(extensionID, at: at)
        }
        if let deadlineMs {
            at = top.next(.deadlineMs, in: &sink)
            sink.value(.integer(deadlineMs), at: at, next: &next)
        }
        if files > 0 {
            at = top.next(.fds, in: &sink)
            sink.value(.integer(Int64(files)), at: at, next: &next)
        }
        return next
    }

    private func emit<Sink: FieldSink>(_ item: ExtensionItem, at index: Int, numberingFilesFrom numbered: inout Int,
                                       into sink: inout Sink, next: inout Int)
    {
        let files = item.fileAttachments.count
        var entries = sink.dictionary(count: 2 + (item.title == nil ? 0 : 1) + (item.text == nil ? 0 : 1) + (files == 0 ? 0 : 1),
                                      at: index, next: &next)
        var at = entries.next(.attachments, in: &sink)
        sink.value(.array(item.attachments), at: at, next: &next)
        at = entries.next(.userInfo, in: &sink)
        sink.value(.dictionary(item.userInfo), at: at, next: &next)
        if let title = item.title {
            at = entries.next(.title, in: &sink)
            sink.string(title, at: at)
        }
        if let text = item.text {
            at = entries.next(.text, in: &sink)
            sink.string(text, at: at)
        }
        if files > 0 {
            at = entries.next(.files, in: &sink)
            let first = sink.container(0xA0, count: files, references: files, at: at, next: &next)
            for j in 0..<files { sink.value(.integer(Int64(numbered + j)), at: first + j, next: &next) }
            numbered += files
        }
    }
}

/// A value of a dictionary written field by field (`BinaryPlistEncoder.encode(fields:appendingTo:)`).
package enum FieldValue {
    case string(String)
    case strings([String])
    case integer(Int64)
    case bool(Bool)
}

extension BinaryPlistEncoder {
    /// Appends the bplist00 payload of a dictionary of `fields`, keys known when the program is built, written
    /// straight from them in order: no `PlistValue` tree and no hashing (the launcher's profile, one per spawn).
    package static func encode(fields: [(StaticString, FieldValue)], appendingTo out: inout [UInt8]) {
        // A key given twice would be read as its first value by one reader and its last by another.
        assert(Set(fields.map { "\($0.0)" }).count == fields.count, "a key is given twice")
        _ = encodeFields(appendingTo: &out, { emit(fields, into: &$0) }, { emit(fields, into: &$0) })
    }

    private static func emit<Sink: FieldSink>(_ fields: [(StaticString, FieldValue)], into sink: inout Sink) -> Int {
        let n = fields.count
        var next = 1
        let first = sink.container(0xD0, count: n, references: 2 * n, at: 0, next: &next)
        for (i, (key, _)) in fields.enumerated() { sink.ascii(key, at: first + i) }
        for (i, (_, value)) in fields.enumerated() {
            let at = first + n + i
            switch value {
            case .string(let s): sink.string(s, at: at)
            case .strings(let list):
                let start = sink.container(0xA0, count: list.count, references: list.count, at: at, next: &next)
                for (j, s) in list.enumerated() { sink.string(s, at: start + j) }
            case .integer(let v): sink.value(.integer(v), at: at, next: &next)
            case .bool(let b): sink.value(.bool(b), at: at, next: &next)
            }
        }
        return next
    }
}
