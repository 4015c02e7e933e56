// What a simulated peer (a fake worker, a daemon client) reads of a frame the engine or the daemon sent it: the
// message's type and its `id` or `seq`, found in the top dictionary without building the message. The peers are
// the simulation's, not the code under test: what they must know is which request a frame is about, and every
// frame they get was written by our own encoder. A frame that brings descriptors (`fds`), or that this does not
// read, is decoded in full as before, so the files a begin or a completion brings are claimed as the runtime and
// the client library claim them. Decoding every frame in full was ~12% of a schedule's instructions.
import SDKWire

/// The fields a peer acts on.
struct PeekedFrame {
    let type: MessageType
    let id: RequestID?
    let seq: Int64?
}

enum FramePeek {
    /// `payload`'s type and id or seq, if it is a bplist00 dictionary this reads, with a `type` and no `fds`;
    /// nil otherwise (the caller decodes it in full).
    static func peek(_ p: UnsafeRawBufferPointer) -> PeekedFrame? {
        let n = p.count
        // The magic, "bplist00", as its 8 bytes load.
        guard n >= 8 + 1 + 32, p.loadUnaligned(as: UInt64.self) == UInt64(littleEndian: 0x3030_7473_696C_7062) else { return nil }
        // Trailer: 6 unused bytes, the offset and reference widths, object count, top object, table offset.
        let trailer = n - 32
        let offsetSize = Int(p[trailer + 6]), refSize = Int(p[trailer + 7])
        guard (1...8).contains(offsetSize), (1...8).contains(refSize) else { return nil }
        let objects = bigEndian(p, trailer + 8, 8), top = bigEndian(p, trailer + 16, 8), table = bigEndian(p, trailer + 24, 8)
        guard objects > 0, objects < n, top < objects, table >= 8, table <= trailer,
            objects <= (trailer - table) / offsetSize
        else { return nil }
        func offset(_ index: Int) -> Int? {
            guard index >= 0, index < objects else { return nil }
            let at = bigEndian(p, table + index * offsetSize, offsetSize)
            return at >= 8 && at < table ? at : nil
        }
        func reference(_ at: Int) -> Int { bigEndian(p, at, refSize) }
        /// The bytes of the ASCII string object at `at`.
        func ascii(_ at: Int) -> UnsafeRawBufferPointer? {
            guard p[at] & 0xF0 == 0x50 else { return nil }
            var start = at + 1, length = Int(p[at] & 0x0F)
            if length == 0x0F {
                guard at + 2 < table, p[at + 1] & 0xF0 == 0x10, p[at + 1] & 0x0F <= 3 else { return nil }
                let width = 1 << Int(p[at + 1] & 0x0F)
                guard at + 2 + width <= table else { return nil }
                length = bigEndian(p, at + 2, width)
                start = at + 2 + width
            }
            guard length <= table - start else { return nil }
            return UnsafeRawBufferPointer(rebasing: p[start..<start + length])
        }
        guard let dictionary = offset(top), p[dictionary] & 0xF0 == 0xD0 else { return nil }
        var count = Int(p[dictionary] & 0x0F), refs = dictionary + 1
        if count == 0x0F {
            guard dictionary + 2 < table, p[dictionary + 1] & 0xF0 == 0x10, p[dictionary + 1] & 0x0F <= 3 else { return nil }
            let width = 1 << Int(p[dictionary + 1] & 0x0F)
            guard dictionary + 2 + width <= table else { return nil }
            count = bigEndian(p, dictionary + 2, width)
            refs = dictionary + 2 + width
        }
        guard count <= (table - refs) / (2 * refSize) else { return nil }
        var type: MessageType?, id: RequestID?, seq: Int64?
        for i in 0..<count {
            guard let keyAt = offset(reference(refs + i * refSize)), let key = ascii(keyAt),
                let valueAt = offset(reference(refs + (count + i) * refSize))
            else { return nil }
            if spells(key, "type") {
                guard let name = ascii(valueAt) else { return nil }
                type = MessageType(ascii: name)
            } else if spells(key, "id") {
                guard let text = ascii(valueAt), let parsed = RequestID(uuidBytes: text) else { return nil }
                id = parsed
            } else if spells(key, "seq") {
                let marker = p[valueAt]
                guard marker & 0xF0 == 0x10, marker & 0x0F <= 3 else { return nil }
                let width = 1 << Int(marker & 0x0F)
                guard valueAt + 1 + width <= table else { return nil }
                seq = Int64(truncatingIfNeeded: bigEndian(p, valueAt + 1, width))
            } else if spells(key, "fds") {
                return nil
            }
        }
        return type.map { PeekedFrame(type: $0, id: id, seq: seq) }
    }

    @inline(__always)
    private static func spells(_ bytes: UnsafeRawBufferPointer, _ name: StaticString) -> Bool {
        guard bytes.count == name.utf8CodeUnitCount else { return false }
        for i in 0..<bytes.count where bytes[i] != name.utf8Start[i] { return false }
        return true
    }

    @inline(__always)
    private static func bigEndian(_ p: UnsafeRawBufferPointer, _ at: Int, _ size: Int) -> Int {
        var v = 0
        for i in 0..<size { v = v << 8 | Int(p[at + i]) }
        return v
    }
}
