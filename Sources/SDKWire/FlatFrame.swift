// The flat messages (`Message.flatFields`: every value a string or an integer, such as `ping`, `pong`, `hello`,
// `welcome`, `assigned`, `cancel`, `credit`, `error`) written as frames straight from their fields and read back
// without a `PlistValue` tree. Building that tree (a Swift Dictionary, so hashing and allocations) and walking it
// to encode, then decoding into another and looking each field up, cost more than everything else the host does
// with a heartbeat or a handshake. The bytes are a plain bplist00 any reader takes: the dictionary, its keys in
// order, then its values, no shared objects.

/// A value in a flat message.
package enum FlatValue: Sendable {
    /// A message type's name.
    case type(MessageType)
    /// A request id, as its 36-character upper-case string.
    case id(RequestID)
    case string(String)
    case integer(Int64)

    /// The value as a decoder reads it back.
    var plist: PlistValue {
        switch self {
        case .type(let type): type.plist
        case .id(let id): .string(id.uuidString)
        case .string(let s): .string(s)
        case .integer(let i): .integer(i)
        }
    }
}

package enum FlatFrame {
    /// Appends the payload (no frame header) of a flat message: the dictionary, its keys in order, then its
    /// values. Over `limit` bytes nothing is appended and the size it would take is returned.
    package static func appendPayload(_ fields: [(MessageKey, FlatValue)], to out: inout [UInt8], limit: Int = .max) -> Int? {
        BinaryPlistEncoder.encodeFields(appendingTo: &out, limit: limit, { emit(fields, into: &$0) }, { emit(fields, into: &$0) })
    }

    /// Objects: 0 the dictionary, 1...n the keys, n+1...2n the values, written in that order.
    private static func emit<Sink: FieldSink>(_ fields: [(MessageKey, FlatValue)], into sink: inout Sink) -> Int {
        let n = fields.count
        var next = 1
        let first = sink.container(0xD0, count: n, references: 2 * n, at: 0, next: &next)
        for (i, (key, _)) in fields.enumerated() { sink.ascii(key.staticName, at: first + i) }
        for (i, (_, value)) in fields.enumerated() {
            switch value {
            case .type(let type): sink.ascii(type.staticName, at: first + n + i)
            case .id(let id): sink.uuid(id, at: first + n + i)
            case .string(let s): sink.string(s, at: first + n + i)
            case .integer(let v): sink.value(.integer(v), at: first + n + i, next: &next)
            }
        }
        return next
    }

    /// The message in `payload` if it is, byte for byte, what `appendPayload` writes for a flat message; nil for
    /// anything else (which is then decoded as usual). The fields are read from where that layout puts them (one-
    /// byte references and offsets, so payloads under 256 bytes; ASCII strings; integers) and the message is made
    /// from them; then it is written again and compared whole. So a payload is taken only if it is exactly our
    /// own encoding of the message returned, which the decoder reads as that message (`FlatFrameTests`): no check
    /// of the decoder's is skipped for any other payload, and a field read wrongly here only declines the fast way.
    package static func message(from payload: UnsafeRawBufferPointer) -> Message? {
        let count = payload.count
        // Magic, the dictionary's marker, one key and one value, the offset table, the 32-byte trailer.
        guard count >= 8 + 1 + 2 + 4 + 3 + 32, count < 256 else { return nil }
        let marker = payload[8]
        guard marker & 0xF0 == 0xD0, marker & 0x0F != 0x0F else { return nil }
        let n = Int(marker & 0x0F)
        let objects = 2 * n + 1
        let tableAt = count - 32 - objects
        // Trailer: one-byte offsets and references, `objects` objects, the table where it is.
        guard n > 0, tableAt > 9 + 2 * n, payload[count - 26] == 1, payload[count - 25] == 1,
            payload[count - 1] == UInt8(tableAt), payload[count - 17] == UInt8(objects)
        else { return nil }
        var fields = Fields()
        for i in 0..<n {
            guard let key = asciiString(payload, objectAt: Int(payload[tableAt + 1 + i]), end: tableAt).flatMap(MessageKey.init(ascii:))
            else { return nil }
            let at = Int(payload[tableAt + 1 + n + i])
            guard at < tableAt else { return nil }
            if payload[at] & 0xF0 == 0x10 {
                let width = 1 << Int(payload[at] & 0x0F)
                guard width <= 8, at + 1 + width <= tableAt else { return nil }
                // Written with 8 bytes when negative, so the bits are the value.
                guard fields.add(key, .integer(Int64(bitPattern: BinaryPlistReader.bigEndian(payload, at: at + 1, size: width)))) else { return nil }
            } else {
                guard let bytes = asciiString(payload, objectAt: at, end: tableAt) else { return nil }
                guard fields.add(key, .ascii(bytes)) else { return nil }
            }
        }
        guard let candidate = fields.message(), let flat = candidate.flatFields else { return nil }
        // Written again into a buffer on the stack and compared.
        return withUnsafeTemporaryAllocation(byteCount: 256, alignment: 8) { buffer in
            var size = EncodedSize()
            _ = emit(flat, into: &size)
            guard let written = BinaryPlistEncoder.write(size, into: buffer, { emit(flat, into: &$0) }), written == count,
                UnsafeRawBufferPointer(rebasing: buffer[0..<count]).elementsEqual(payload)
            else { return nil }
            return candidate
        }
    }

    /// A flat payload's fields as read: the bytes of an ASCII string, or an integer.
    private enum Raw {
        case ascii(UnsafeRawBufferPointer)
        case integer(Int64)
    }

    /// The fields of one payload (at most five, so no allocation and no hashing), found by a linear
    /// search. A key given twice is refused by the comparison: the message written again has it once.
    private struct Fields {
        private var keys = InlineArray<5, MessageKey?>(repeating: nil)
        private var raws = InlineArray<5, Raw>(repeating: .integer(0))
        private var count = 0

        /// Adds a field; false when there is no room (no flat message has more).
        mutating func add(_ key: MessageKey, _ value: Raw) -> Bool {
            guard count < keys.count else { return false }
            keys[count] = key
            raws[count] = value
            count += 1
            return true
        }

        subscript(key: MessageKey) -> Raw? {
            for i in 0..<count where keys[i] == key { return raws[i] }
            return nil
        }

        func integer(_ key: MessageKey) -> Int64? {
            if case .integer(let v)? = self[key] { v } else { nil }
        }
        func string(_ key: MessageKey) -> String? {
            if case .ascii(let bytes)? = self[key] { String(decoding: bytes, as: UTF8.self) } else { nil }
        }
        func id(_ key: MessageKey = .id) -> RequestID? {
            if case .ascii(let bytes)? = self[key] { RequestID(uuidBytes: bytes) } else { nil }
        }

        /// The flat message these fields are, as `Message(plist:)` reads it; nil for any other.
        func message() -> Message? {
            guard case .ascii(let name)? = self[.type], let type = MessageType(ascii: name) else { return nil }
            switch type {
            case .hello:
                guard let version = integer(.version), let identifier = string(.identifier), let pid = integer(.hostPid),
                    let idle = integer(.idleTimeoutMs) else { return nil }
                return .hello(version: version, identifier: identifier, hostPid: Int32(truncatingIfNeeded: pid), idleTimeoutMs: idle)
            case .welcome:
                guard let version = integer(.version), let identifier = string(.identifier),
                    let pid = integer(.pid).flatMap(Int32.init(exactly:)) else { return nil }
                return .welcome(version: version, identifier: identifier, pid: pid)
            case .credit:
                guard let id = id(), let count = integer(.count) else { return nil }
                return .credit(id: id, count: count)
            case .cancel: return id().map { .cancel(id: $0) }
            case .ping: return integer(.seq).map { .ping(seq: $0) }
            case .pong: return integer(.seq).map { .pong(seq: $0) }
            case .status: return integer(.seq).map { .status(seq: $0) }
            case .error:
                guard let message = string(.message) else { return nil }
                if self[.id] == nil { return .error(message: message, id: nil) }
                return id().map { .error(message: message, id: $0) }
            case .connect:
                guard let version = integer(.version) else { return nil }
                if self[.app] == nil { return .connect(version: version, app: nil) }
                return string(.app).map { .connect(version: version, app: $0) }
            case .prewarm:
                guard let id = id(), let extensionID = string(.`extension`) else { return nil }
                return .prewarm(id: id, extensionID: extensionID)
            case .prewarmed:
                guard let id = id(), let pid = integer(.pid).flatMap(Int32.init(exactly:)) else { return nil }
                return .prewarmed(id: id, pid: pid)
            case .assigned:
                guard let id = id(), let pid = integer(.pid).flatMap(Int32.init(exactly:)) else { return nil }
                return .assigned(id: id, pid: pid)
            case .subscribe: return .subscribe
            case .launchFailed: return string(.reason).map { .launchFailed(reason: $0) }
            case .hostCallCancel:
                guard let id = id(), let call = integer(.call) else { return nil }
                return .hostCallCancel(id: id, call: call)
            case .begin, .complete, .partial, .cancelled, .connected, .event, .interrupted, .sandboxed, .statusReport,
                .leak, .hostCall, .hostCallResult, .hostCallError:
                return nil
            }
        }
    }

    /// The bytes of the ASCII string object at `at` (a one-byte length, or `0x5F` and a one-byte integer).
    private static func asciiString(_ payload: UnsafeRawBufferPointer, objectAt at: Int, end: Int) -> UnsafeRawBufferPointer? {
        guard at < end, payload[at] & 0xF0 == 0x50 else { return nil }
        var start = at + 1
        var length = Int(payload[at] & 0x0F)
        if length == 0x0F {
            guard at + 2 < end, payload[at + 1] == 0x10 else { return nil }
            length = Int(payload[at + 2])
            start = at + 3
        }
        guard start + length <= end else { return nil }
        let bytes = UnsafeRawBufferPointer(rebasing: payload[start..<start + length])
        for b in bytes where b >= 0x80 { return nil }
        return bytes
    }
}

extension MessageKey {
    /// The key these ASCII bytes spell, if any: compared with the keys of the same length, without a `String`.
    init?(ascii bytes: UnsafeRawBufferPointer) {
        guard let key = Self.byLength[min(bytes.count, 16)].first(where: { bytes.spells($0.staticName) }) else { return nil }
        self = key
    }

    /// Every key, by the length of its name (index 16 holds those of 16 bytes or more: none).
    private static let byLength: [[MessageKey]] = (0...16).map { length in allCases.filter { $0.staticName.utf8CodeUnitCount == length } }
}

extension MessageType {
    /// The type these ASCII bytes spell, if any.
    init?(ascii bytes: UnsafeRawBufferPointer) {
        guard let type = Self.byLength[min(bytes.count, 16)].first(where: { bytes.spells($0.staticName) }) else { return nil }
        self = type
    }

    private static let byLength: [[MessageType]] = (0...16).map { length in allCases.filter { $0.staticName.utf8CodeUnitCount == length } }
}
