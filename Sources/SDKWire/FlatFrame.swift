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

enum FlatFrame {
    /// Appends the frame of `message` if it is one of the flat messages, and returns whether it did.
    static func append(_ message: Message, to out: inout [UInt8]) -> Bool {
        switch message {
        case .assigned(let id, let pid):
            append(("type", .ascii("assigned")), ("id", .id(id)), ("pid", .integer(Int64(pid))), to: &out)
        case .cancel(let id):
            append(("type", .ascii("cancel")), ("id", .id(id)), nil, to: &out)
        case .credit(let id, let count):
            append(("type", .ascii("credit")), ("id", .id(id)), ("count", .integer(count)), to: &out)
        default:
            return false
        }
        return true
    }

    /// Keys and values are short (under 15 bytes, or the 36-byte id), so the whole payload stays under 256 bytes
    /// and every offset fits one byte.
    static func append(_ a: (StaticString, FlatValue), _ b: (StaticString, FlatValue), _ c: (StaticString, FlatValue)?,
                       to out: inout [UInt8])
    {
        let n = c == nil ? 2 : 3
        let frameAt = out.count
        out.append(contentsOf: [0, 0, 0, 0])
        let start = out.count
        out.append(contentsOf: bplistMagic)
        // Objects: 0 the dictionary, 1...n the keys, n+1...2n the values.
        var offsets: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &offsets) { table in
            table[0] = UInt8(out.count - start)
            out.append(0xD0 | UInt8(n))
            for i in 1...(2 * n) { out.append(UInt8(i)) }
            for (i, entry) in [a, b, c].enumerated() {
                guard let (key, _) = entry else { continue }
                table[1 + i] = UInt8(out.count - start)
                writeASCII(key, to: &out)
            }
            for (i, entry) in [a, b, c].enumerated() {
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
        let length = out.count - start
        out[frameAt + 2] = UInt8(truncatingIfNeeded: length >> 8)
        out[frameAt + 3] = UInt8(truncatingIfNeeded: length)
    }

    private static func writeASCII(_ s: StaticString, to out: inout [UInt8]) {
        out.append(0x50 | UInt8(s.utf8CodeUnitCount))
        out.append(contentsOf: UnsafeBufferPointer(start: s.utf8Start, count: s.utf8CodeUnitCount))
    }

}
