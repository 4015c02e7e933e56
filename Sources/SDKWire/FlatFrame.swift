// The small per-request messages (`assigned`, `cancel`, `credit`) written as frames straight from their fields.
// Each is a dictionary of two or three ASCII keys with ASCII-string or integer values; building a `PlistValue`
// tree (a Swift Dictionary, so hashing and allocations) and walking it twice to encode that cost the daemon more
// than the forwarding of the request itself. The bytes are a plain bplist00 any reader takes: one-byte offsets
// and references, keys then values, no shared objects.

/// A value in a flat message.
enum FlatValue {
    case ascii(StaticString)
    case id(RequestID)
    case integer(Int64)
}

/// A flat message's entries: two, or three.
typealias FlatEntries = ((StaticString, FlatValue), (StaticString, FlatValue), (StaticString, FlatValue)?)

enum FlatFrame {
    /// The entries of `message` if it is one of the flat messages.
    static func entries(of message: Message) -> FlatEntries? {
        switch message {
        case .assigned(let id, let pid): (("type", .ascii("assigned")), ("id", .id(id)), ("pid", .integer(Int64(pid))))
        case .cancel(let id): (("type", .ascii("cancel")), ("id", .id(id)), nil)
        case .credit(let id, let count): (("type", .ascii("credit")), ("id", .id(id)), ("count", .integer(count)))
        default: nil
        }
    }

    /// Appends the payload (no frame header) of a flat message. Keys and values are short (under 15 bytes, or the
    /// 36-byte id), so the whole payload stays under 256 bytes and every offset fits one byte.
    static func appendPayload(_ entries: FlatEntries, to out: inout [UInt8]) {
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
                    out.withUnsafeMutableBytes { id.writeUUID(into: UnsafeMutableRawBufferPointer(rebasing: $0[at..<at + 36])) }
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

    private static func writeASCII(_ s: StaticString, to out: inout [UInt8]) {
        out.append(0x50 | UInt8(s.utf8CodeUnitCount))
        out.append(contentsOf: UnsafeBufferPointer(start: s.utf8Start, count: s.utf8CodeUnitCount))
    }

}
