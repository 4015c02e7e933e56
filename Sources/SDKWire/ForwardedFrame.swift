// Forwarding a frame without re-encoding it (the daemon: a client's `begin` to a worker, a worker's `complete` to
// the client). The message was checked once, scanned by ForwardScan or decoded; what is sent on is its payload
// byte for byte, with only the request id rewritten in place (the daemon gives each client request its own id
// towards the worker). An encoder writes a request id as a 36-character ASCII string object; `idRange` finds those
// 36 bytes through the payload's trailer, offset table and top-level dictionary. A payload that holds its id any
// other way (a UTF-16 string, say) is not forwardable, and the sender encodes the decoded message instead.
//
// The id object is rewritten wherever the payload refers to it: a peer that also used it as, say, an item's title
// sees that title rewritten, in its own request only.

/// A payload to send on as it is, with its request id at `idRange`. Only payloads that carry no descriptors are
/// forwarded (FramedConnection.withForwardablePayload).
package struct ForwardedFrame: Sendable {
    package var payload: [UInt8]
    package let idRange: Range<Int>

    /// The payload of a message just decoded, if its id can be rewritten in place.
    package init?(payload: UnsafeRawBufferPointer) {
        guard let range = Self.idRange(in: payload) else { return nil }
        self.payload = Array(payload)
        idRange = range
    }

    /// A payload whose id is already known to be at `idRange` (ForwardScan found it).
    package init(payload: UnsafeRawBufferPointer, idRange: Range<Int>) {
        self.payload = Array(payload)
        self.idRange = idRange
    }

    /// Where the 36 ASCII bytes of the top-level dictionary's "id" string are, or nil if there are none. Every
    /// read is bounds-checked: the payload may come from a hostile peer (though it has decoded once already).
    package static func idRange(in p: UnsafeRawBufferPointer) -> Range<Int>? {
        guard p.count >= 40, p[0] == 0x62, p[1] == 0x70,  // "bp"
            let layout = Layout(p), layout.top < layout.objects
        else { return nil }
        let (trailer, refSize, objects) = (layout.trailer, layout.refSize, layout.objects)
        guard let dict = layout.offset(layout.top), p[dict] >> 4 == 0xD else { return nil }
        var count = Int(p[dict] & 0x0F), refs = dict + 1
        if count == 0x0F {
            // The count follows as an integer object: 0x1k, then 2^k bytes.
            guard dict + 1 < trailer, p[dict + 1] >> 4 == 0x1, let c = layout.uint(dict + 2, 1 << Int(p[dict + 1] & 0x0F))
            else { return nil }
            count = c
            refs = dict + 2 + (1 << Int(p[dict + 1] & 0x0F))
        }
        guard count <= objects else { return nil }
        // A second "id" key is refused: a decoder keeps the last, and this would rewrite the first. So is a key in
        // any form but an ASCII string (short, or with its length as a one-byte integer), as encoders write keys:
        // a UTF-16 "id" is an id key too, and one this loop did not see would be the one a decoder reads.
        var found: Range<Int>?
        for k in 0..<count {
            guard let keyRef = layout.uint(refs + k * refSize, refSize), let key = layout.offset(keyRef),
                key + 1 <= trailer, p[key] >> 4 == 0x5
            else { return nil }
            var length = Int(p[key] & 0x0F), start = key + 1
            if length == 0x0F {
                guard key + 3 <= trailer, p[key + 1] == 0x10 else { return nil }
                length = Int(p[key + 2])
                start = key + 3
            }
            guard length == 2, start + 2 <= trailer,
                UnsafeRawBufferPointer(rebasing: p[start..<(start + 2)]).spells(MessageKey.id.staticName)
            else { continue }
            guard let valueRef = layout.uint(refs + (count + k) * refSize, refSize), let value = layout.offset(valueRef),
                value + 3 + 36 <= trailer, p[value] == 0x5F, p[value + 1] == 0x10, p[value + 2] == 36
            else { return nil }
            guard found == nil else { return nil }
            found = (value + 3)..<(value + 3 + 36)
        }
        guard let found, idStandsAlone(in: p, at: found) else { return nil }
        return found
    }

    /// Whether the id string whose 36 bytes are at `range` shares none of its bytes with anything else a decoder
    /// reads: no other object, no container's references, not the offset table. A decoder allows objects to
    /// overlap; one laid over the id would read otherwise once the id is rewritten (a frame the receiver
    /// decodes as another message, or cannot decode: its connection, and every request on it, would end).
    /// Every object's extent is read from its header; a marker it does not know refuses.
    package static func idStandsAlone(in p: UnsafeRawBufferPointer, at range: Range<Int>) -> Bool {
        guard range.lowerBound >= 11, let layout = Layout(p) else { return false }
        let n = p.count
        let (trailer, offsetSize, refSize, objects, table) = (layout.trailer, layout.offsetSize, layout.refSize, layout.objects, layout.table)
        let id = (range.lowerBound - 3)..<range.upperBound
        // The offset table (and the trailer after it).
        let (tableBytes, overflow) = objects.multipliedReportingOverflow(by: offsetSize)
        guard !overflow, tableBytes <= n - table, !id.overlaps(table..<(table + tableBytes)), id.upperBound <= trailer
        else { return false }
        /// Where the object at `at` ends, or nil for a marker or a length this does not read.
        func end(ofObjectAt at: Int) -> Int? {
            guard at < n else { return nil }
            let marker = p[at], low = Int(marker & 0x0F)
            func counted(_ unit: Int) -> Int? {
                var count = low, start = at + 1
                if low == 0x0F {
                    guard at + 1 < n, p[at + 1] >> 4 == 0x1, p[at + 1] & 0x0F <= 3 else { return nil }
                    let width = 1 << Int(p[at + 1] & 0x0F)
                    guard let c = layout.uint(at + 2, width) else { return nil }
                    count = c
                    start = at + 2 + width
                }
                let (bytes, over) = count.multipliedReportingOverflow(by: unit)
                guard !over, bytes <= n - start else { return nil }
                return start + bytes
            }
            switch marker >> 4 {
            case 0x0: return at + 1
            case 0x1, 0x2: return low <= 4 ? at + 1 + (1 << low) : nil
            case 0x3: return at + 9
            case 0x4, 0x5: return counted(1)
            case 0x6: return counted(2)
            case 0x8: return at + 2 + low
            case 0xA, 0xC: return counted(refSize)
            case 0xD: return counted(2 * refSize)
            default: return nil
            }
        }
        for index in 0..<objects {
            guard let at = layout.offset(index) else { return false }
            if at == id.lowerBound { continue }  // the id itself, under this index or another
            guard let last = end(ofObjectAt: at), !id.overlaps(at..<last) else { return false }
        }
        return true
    }

    /// A payload's trailer (its widths, object count, top object and offset table), with the two reads both
    /// walks above make through it, every one bounds-checked: the payload may come from a hostile peer.
    private struct Layout {
        let p: UnsafeRawBufferPointer
        let trailer: Int, offsetSize: Int, refSize: Int, objects: Int, top: Int, table: Int

        init?(_ p: UnsafeRawBufferPointer) {
            let n = p.count
            guard n >= 40 else { return nil }
            self.p = p
            trailer = n - 32
            offsetSize = Int(p[trailer + 6])
            refSize = Int(p[trailer + 7])
            guard (1...8).contains(offsetSize), (1...8).contains(refSize) else { return nil }
            guard let objects = Self.uint(p, trailer + 8, 8), let top = Self.uint(p, trailer + 16, 8),
                let table = Self.uint(p, trailer + 24, 8), objects <= n, table <= n
            else { return nil }
            (self.objects, self.top, self.table) = (objects, top, table)
        }

        /// The big-endian integer of `size` (1...8) bytes at `at`; nil past the payload or past `Int.max`.
        static func uint(_ p: UnsafeRawBufferPointer, _ at: Int, _ size: Int) -> Int? {
            guard at >= 0, size >= 1, size <= 8, at <= p.count - size else { return nil }
            let v = BinaryPlistReader.bigEndian(p, at: at, size: size)
            return v <= UInt64(Int.max) ? Int(v) : nil
        }
        func uint(_ at: Int, _ size: Int) -> Int? { Self.uint(p, at, size) }

        /// Where object `index` starts: nil past the table, or for an offset into the trailer.
        func offset(_ index: Int) -> Int? {
            guard index < objects, let at = uint(table + index * offsetSize, offsetSize), at < trailer else { return nil }
            return at
        }
    }

    /// Writes `id` over the payload's id.
    package static func write(_ id: RequestID, into bytes: inout [UInt8], at range: Range<Int>) {
        precondition(range.count == 36)
        bytes.withUnsafeMutableBytes { id.writeUUID(into: UnsafeMutableRawBufferPointer(rebasing: $0[range])) }
    }
}

extension OutgoingDescriptors {
    /// Appends `payload` as a frame with `id` written over its own id: a forwarded message (with no descriptors),
    /// byte for byte otherwise.
    ///
    /// - Throws: `WireError` for a payload over `limits`; nothing is appended then.
    package mutating func appendForwarded(_ payload: UnsafeRawBufferPointer, id: RequestID, idRange: Range<Int>,
                                          to bytes: inout [UInt8], limits: WireLimits = .default) throws(WireError)
    {
        let start = bytes.count + Frame.headerSize
        try Frame.append(to: &bytes, limits: limits) { $0.append(contentsOf: payload); return nil }
        ForwardedFrame.write(id, into: &bytes, at: (start + idRange.lowerBound)..<(start + idRange.upperBound))
    }
}
