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
        case .assigned(let id, let pid): (("type", .ascii("assigned")), ("id", .id(id)), ("pid", .integer(Int64(pid))))
        case .cancel(let id): (("type", .ascii("cancel")), ("id", .id(id)), nil)
        case .credit(let id, let count): (("type", .ascii("credit")), ("id", .id(id)), ("count", .integer(count)))
        default: nil
        }
    }

    /// Appends the payload (no frame header) of a flat message. Keys and values are short (under 15 bytes, or the
    /// 36-byte id), so the whole payload stays under 256 bytes and every offset fits one byte.
    package static func appendPayload(_ entries: FlatEntries, to out: inout [UInt8]) {
        let (a, b, c) = entries
        let n = c == nil ? 2 : 3
        let all = [a, b, c]
        let start = out.count
        out.append(contentsOf: bplistMagic)
        // Objects: 0 the dictionary, 1...n the keys, n+1...2n the values.
        var offsets: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &offsets) { table in
            table[0] = UInt8(out.count - start)
            out.append(0xD0 | UInt8(n))
            for i in 1...(2 * n) { out.append(UInt8(i)) }
            for (i, entry) in all.enumerated() {
                guard let (key, _) = entry else { continue }
                table[1 + i] = UInt8(out.count - start)
                writeASCII(key, to: &out)
            }
            for (i, entry) in all.enumerated() {
                guard let (_, value) = entry else { continue }
                table[1 + n + i] = UInt8(out.count - start)
                switch value {
                case .ascii(let s): writeASCII(s, to: &out)
                case .id(let id):
                    out.append(contentsOf: [0x5F, 0x10, 36])
                    let at = out.count
                    out.append(contentsOf: repeatElement(0, count: 36))
                    ForwardedFrame.write(id, into: &out, at: at..<at + 36)
                case .integer(let v): appendPlistInteger(v, to: &out)
                }
            }
            let tableAt = out.count - start
            for i in 0...(2 * n) { out.append(table[i]) }
            out.append(contentsOf: [0, 0, 0, 0, 0, 0, 1, 1])
            appendBigEndian(UInt64(2 * n + 1), size: 8, to: &out)
            appendBigEndian(0, size: 8, to: &out)
            appendBigEndian(UInt64(tableAt), size: 8, to: &out)
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
        switch (n, type.elementsEqual("assigned".utf8), type.elementsEqual("credit".utf8), type.elementsEqual("cancel".utf8)) {
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

    private static func writeASCII(_ s: StaticString, to out: inout [UInt8]) {
        out.append(0x50 | UInt8(s.utf8CodeUnitCount))
        out.append(contentsOf: UnsafeBufferPointer(start: s.utf8Start, count: s.utf8CodeUnitCount))
    }

}
