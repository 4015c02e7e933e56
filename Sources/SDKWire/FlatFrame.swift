// The small per-request messages (`assigned`, `cancel`, `credit`) written as frames straight from their fields.
// Each is a dictionary of two or three ASCII keys with ASCII-string or integer values; building a `PlistValue`
// tree (a Swift Dictionary, so hashing and allocations) and walking it twice to encode that cost the daemon more
// than the forwarding of the request itself. The bytes are a plain bplist00 any reader takes: one-byte offsets
// and references, keys then values, no shared objects.

/// A value in a flat message.
package enum FlatValue {
    case ascii(StaticString)
    case id(RequestID)
    case integer(Int64)
}

/// A flat message's entries: two, or three.
package typealias FlatEntries = ((StaticString, FlatValue), (StaticString, FlatValue), (StaticString, FlatValue)?)

package enum FlatFrame {
    /// The entries of `message` if it is one of the flat messages.
    package static func entries(of message: Message) -> FlatEntries? {
        switch message {
        case .assigned(let id, let pid): ((MessageKey.type.staticName, .ascii(MessageType.assigned.staticName)), (MessageKey.id.staticName, .id(id)), (MessageKey.pid.staticName, .integer(Int64(pid))))
        case .cancel(let id): ((MessageKey.type.staticName, .ascii(MessageType.cancel.staticName)), (MessageKey.id.staticName, .id(id)), nil)
        case .credit(let id, let count): ((MessageKey.type.staticName, .ascii(MessageType.credit.staticName)), (MessageKey.id.staticName, .id(id)), (MessageKey.count.staticName, .integer(count)))
        default: nil
        }
    }

    /// Appends the payload (no frame header) of a flat message: the dictionary, its keys in order, then its
    /// values. Keys and values are short (under 15 bytes, or the 36-byte id), so the whole payload stays under 256
    /// bytes and every offset and reference takes one byte.
    package static func appendPayload(_ entries: FlatEntries, to out: inout [UInt8]) {
        BinaryPlistEncoder.encodeFields(appendingTo: &out, { emit(entries, into: &$0) }, { emit(entries, into: &$0) })
    }

    /// Objects: 0 the dictionary, 1...n the keys, n+1...2n the values, written in that order.
    private static func emit<Sink: FieldSink>(_ entries: FlatEntries, into sink: inout Sink) -> Int {
        let (a, b, c) = entries
        let n = c == nil ? 2 : 3
        var next = 1
        let first = sink.container(0xD0, count: n, references: 2 * n, at: 0, next: &next)
        sink.ascii(a.0, at: first)
        sink.ascii(b.0, at: first + 1)
        if let c { sink.ascii(c.0, at: first + 2) }
        emit(a.1, at: first + n, into: &sink, next: &next)
        emit(b.1, at: first + n + 1, into: &sink, next: &next)
        if let c { emit(c.1, at: first + n + 2, into: &sink, next: &next) }
        return next
    }

    private static func emit<Sink: FieldSink>(_ value: FlatValue, at index: Int, into sink: inout Sink, next: inout Int) {
        switch value {
        case .ascii(let s): sink.ascii(s, at: index)
        case .id(let id): sink.uuid(id, at: index)
        case .integer(let v): sink.value(.integer(v), at: index, next: &next)
        }
    }

    /// The message in `payload` if it is, byte for byte, what `appendPayload` writes for an `assigned`, `cancel`
    /// or `credit`; nil for anything else (which is then decoded as usual). The fields are read from where that
    /// layout puts them and the message is written again and compared whole, so a payload is taken only if it is
    /// exactly our own encoding of the message returned: no check of the decoder's is skipped for any other.
    /// A daemon client receives an `assigned` per request; decoding it made a dictionary and hashed its keys.
    package static func message(from payload: UnsafeRawBufferPointer) -> Message? {
        let count = payload.count
        // Magic, the dictionary's marker and 2n one-byte references, n keys, n values, the offset table
        // (2n + 1 bytes), the 32-byte trailer.
        guard count > 8 + 1 + 39 + 32, count < 256, payload[8] == 0xD2 || payload[8] == 0xD3 else { return nil }
        let n = Int(payload[8] & 0x0F)
        let tableAt = count - 32 - (2 * n + 1)
        guard tableAt > 9 + 2 * n else { return nil }
        let typeAt = Int(payload[tableAt + 1 + n]), idAt = Int(payload[tableAt + 2 + n])
        guard idAt + 39 <= tableAt, payload[idAt] == 0x5F, payload[idAt + 1] == 0x10, payload[idAt + 2] == 36,
            let id = RequestID(uuidBytes: UnsafeRawBufferPointer(rebasing: payload[idAt + 3..<idAt + 39])),
            typeAt < tableAt, payload[typeAt] & 0xF0 == 0x50
        else { return nil }
        let typeLength = Int(payload[typeAt] & 0x0F)
        guard typeAt + 1 + typeLength <= tableAt else { return nil }
        let type = UnsafeRawBufferPointer(rebasing: payload[typeAt + 1..<typeAt + 1 + typeLength])
        var integer: Int64 = 0
        if n == 3 {
            let at = Int(payload[tableAt + 3 + n])
            guard at < tableAt, payload[at] & 0xF0 == 0x10, payload[at] & 0x0F <= 3 else { return nil }
            let width = 1 << Int(payload[at] & 0x0F)
            guard at + 1 + width <= tableAt else { return nil }
            // Written with 8 bytes when negative, so the bits are the value.
            integer = Int64(bitPattern: BinaryPlistReader.bigEndian(payload, at: at + 1, size: width))
        }
        let candidate: Message
        switch (n, type.spells(MessageType.assigned.staticName), type.spells(MessageType.credit.staticName),
                type.spells(MessageType.cancel.staticName)) {
        case (3, true, _, _):
            guard let pid = Int32(exactly: integer) else { return nil }
            candidate = .assigned(id: id, pid: pid)
        case (3, _, true, _): candidate = .credit(id: id, count: integer)
        case (2, _, _, true): candidate = .cancel(id: id)
        default: return nil
        }
        guard let entries = entries(of: candidate) else { return nil }
        var again: [UInt8] = []
        again.reserveCapacity(count)
        appendPayload(entries, to: &again)
        return again.withUnsafeBytes { $0.elementsEqual(payload) } ? candidate : nil
    }
}
