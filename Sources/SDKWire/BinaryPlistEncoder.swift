// Encoder for binary property lists (bplist00).
//
// Two passes over the value tree and no intermediate object list. The first pass counts objects, references and
// bytes, which fixes the reference and offset widths and so the payload's exact size; the buffer grows once and
// the second pass stores every object, reference and offset-table entry in place through a raw pointer, with no
// per-byte append (an `Array.append` checks capacity and uniqueness each time, which was most of the cost). A
// container reserves consecutive indices for its children, so an object's index is known before its bytes are.
// Objects are not deduplicated: messages are small trees and hashing costs more than it saves. Strings are ASCII
// when they can be and UTF-16BE otherwise, as Foundation and plistlib write them.

/// Encodes `PlistValue`s as bplist00.
public struct BinaryPlistEncoder: Sendable {
    /// Creates an encoder.
    public init() {}

    /// Encodes `value` as a complete bplist00 payload.
    public static func encode(_ value: PlistValue) -> [UInt8] {
        var encoder = BinaryPlistEncoder()
        var out: [UInt8] = []
        encoder.encode(value, appendingTo: &out)
        return out
    }

    /// Appends the bplist00 encoding of `value` to `out`.
    ///
    /// - Parameters:
    ///   - value: The value to encode.
    ///   - out: The buffer to append to; existing bytes are kept (a frame header, say).
    public mutating func encode(_ value: PlistValue, appendingTo out: inout [UInt8]) {
        _ = encode(value, appendingTo: &out, limit: .max)
    }

    /// Appends the bplist00 encoding of `value` to `out` unless it would take more than `limit` bytes: then
    /// nothing is appended (nor copied) and its size is returned.
    package mutating func encode(_ value: PlistValue, appendingTo out: inout [UInt8], limit: Int) -> Int? {
        var size = EncodedSize()
        size.add(value)
        return Self.write(size, appendingTo: &out, limit: limit) { writer in
            var next = 1
            writer.write(value, index: 0, next: &next)
            return next
        }
    }

    /// Sizes the payload from the first pass, grows `out` once, lets `writeObjects` store the objects from index 0
    /// (it returns how many it stored), then stores the trailer. A payload over `limit` bytes is not written: its
    /// size is returned (a reply of hundreds of MiB is refused without being copied).
    static func write(_ size: EncodedSize, appendingTo out: inout [UInt8], limit: Int = .max,
                      _ writeObjects: (inout Writer) -> Int) -> Int? {
        let total = size.layout.total
        if total > limit { return total }
        let start = out.count
        appendZeros(total, to: &out)
        out.withUnsafeMutableBytes { buffer in
            _ = write(size, into: UnsafeMutableRawBufferPointer(rebasing: buffer[start...]), writeObjects)
        }
        return nil
    }

    /// Stores the payload sized by `size` at the start of `buffer` and returns its length; nil, with nothing
    /// stored, when it does not fit.
    static func write(_ size: EncodedSize, into buffer: UnsafeMutableRawBufferPointer,
                      _ writeObjects: (inout Writer) -> Int) -> Int? {
        let (refSize, offsetSize, tableOffset, total) = size.layout
        guard total <= buffer.count, let base = buffer.baseAddress else { return nil }
        var writer = Writer(base: base, refSize: refSize, offsetSize: offsetSize, table: base + tableOffset)
        writer.putBytes(bplistMagic)
        let written = writeObjects(&writer)
        precondition(writer.cursor == tableOffset && written == size.objects,
                     "bplist encoder: the size pass and the write pass disagree")
        // Trailer: 6 unused bytes, the two widths, object count, top object 0, offset table position.
        let trailer = base + tableOffset + size.objects * offsetSize
        trailer.initializeMemory(as: UInt8.self, repeating: 0, count: 6)
        trailer.storeBytes(of: UInt8(offsetSize), toByteOffset: 6, as: UInt8.self)
        trailer.storeBytes(of: UInt8(refSize), toByteOffset: 7, as: UInt8.self)
        trailer.storeBytes(of: UInt64(size.objects).bigEndian, toByteOffset: 8, as: UInt64.self)
        trailer.storeBytes(of: UInt64(0), toByteOffset: 16, as: UInt64.self)
        trailer.storeBytes(of: UInt64(tableOffset).bigEndian, toByteOffset: 24, as: UInt64.self)
        return total
    }
}

/// The first pass: objects, references and the bytes of every object apart from its references.
struct EncodedSize {
    var objects = 0
    var references = 0
    var bytes = 0

    /// The widths of a reference and of an offset, where the offset table starts, and the whole payload's
    /// length (magic, objects, references, offset table, trailer).
    var layout: (refSize: Int, offsetSize: Int, tableOffset: Int, total: Int) {
        let refSize = byteWidth(UInt64(objects))
        let tableOffset = bplistMagic.count + bytes + references * refSize
        let offsetSize = byteWidth(UInt64(tableOffset))
        return (refSize, offsetSize, tableOffset, tableOffset + objects * offsetSize + 32)
    }

    mutating func add(_ value: PlistValue) {
        objects += 1
        switch value {
        case .bool: bytes += 1
        case .integer(let i): bytes += i < 0 ? 9 : 1 + byteWidth(UInt64(i))
        case .real, .date: bytes += 9
        case .data(let d): bytes += headerSize(d.count) + d.count
        case .string(let s): addString(s)
        case .array(let elements):
            bytes += headerSize(elements.count)
            references += elements.count
            for e in elements { add(e) }
        case .dictionary(let entries):
            bytes += headerSize(entries.count)
            references += 2 * entries.count
            for (k, v) in entries {
                objects += 1
                addString(k)
                add(v)
            }
        }
    }

    mutating func addString(_ s: String) {
        let (ascii, count) = stringShape(s)
        bytes += headerSize(count) + (ascii ? count : 2 * count)
    }
}

/// A marker byte plus, from 15 elements on, an integer object holding the count.
@inline(__always)
func headerSize(_ count: Int) -> Int { count < 15 ? 1 : 2 + byteWidth(UInt64(count)) }

/// Whether `s` is ASCII, and its length in the units it will be written in (bytes, or UTF-16 code units).
@inline(__always)
private func stringShape(_ s: String) -> (ascii: Bool, count: Int) {
    if let shape = s.utf8.withContiguousStorageIfAvailable({ isASCII($0) ? (true, $0.count) : nil }), let shape {
        return shape
    }
    var copy = s
    if copy.withUTF8({ isASCII($0) }) { return (true, copy.utf8.count) }
    return (false, s.utf16.count)
}

/// No byte has its top bit set.
@inline(__always)
private func isASCII(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool { firstNonASCII(UnsafeRawBufferPointer(bytes)) == nil }

/// The first byte of `bytes` that is not ASCII (0x80 or above), or nil. Eight bytes at a time: every string of
/// every message is checked, written or read (a request id is 36 bytes); the decoder's byte-by-byte loop was ~2%
/// of the simulation.
@inline(__always)
func firstNonASCII(_ bytes: UnsafeRawBufferPointer) -> UInt8? {
    guard let base = bytes.baseAddress else { return nil }
    let count = bytes.count
    var i = 0
    while i + 8 <= count {
        if base.loadUnaligned(fromByteOffset: i, as: UInt64.self) & 0x8080_8080_8080_8080 != 0 { break }
        i += 8
    }
    while i < count {
        let b = base.load(fromByteOffset: i, as: UInt8.self)
        if b >= 0x80 { return b }
        i += 1
    }
    return nil
}

/// The second pass: stores each object at `cursor` and its offset in the table, in a buffer the first pass sized.
struct Writer {
    let base: UnsafeMutableRawPointer
    let refSize: Int
    let offsetSize: Int
    let table: UnsafeMutableRawPointer
    var cursor = 0

    init(base: UnsafeMutableRawPointer, refSize: Int, offsetSize: Int, table: UnsafeMutableRawPointer) {
        self.base = base
        self.refSize = refSize
        self.offsetSize = offsetSize
        self.table = table
    }

    /// The object about to be stored at `cursor` is object `index`.
    @inline(__always)
    mutating func storeOffset(of index: Int) {
        storeBigEndian(UInt64(cursor), size: offsetSize, at: table + index * offsetSize)
    }

    mutating func write(_ value: PlistValue, index: Int, next: inout Int) {
        storeOffset(of: index)
        switch value {
        case .bool(let b):
            put(b ? 0x09 : 0x08)
        case .integer(let i):
            putInteger(i)
        case .real(let d):
            put(0x23)
            putBigEndian(d.bitPattern, size: 8)
        case .date(let d):
            put(0x33)
            putBigEndian(d.secondsSinceReferenceDate.bitPattern, size: 8)
        case .data(let bytes):
            putHeader(0x40, count: bytes.count)
            putBytes(bytes)
        case .string(let s):
            putString(s)
        case .array(let elements):
            let first = next
            next += elements.count
            putHeader(0xA0, count: elements.count)
            for i in 0..<elements.count { putBigEndian(UInt64(first + i), size: refSize) }
            var i = first
            for e in elements {
                write(e, index: i, next: &next)
                i += 1
            }
        case .dictionary(let entries):
            let n = entries.count
            let first = next
            next += 2 * n
            putHeader(0xD0, count: n)
            for i in 0..<(2 * n) { putBigEndian(UInt64(first + i), size: refSize) }
            // Keys take indices first..<first+n and values first+n..<first+2n, in the dictionary's iteration order.
            var i = first
            for key in entries.keys {
                storeOffset(of: i)
                putString(key)
                i += 1
            }
            for v in entries.values {
                write(v, index: i, next: &next)
                i += 1
            }
        }
    }

    @inline(__always)
    mutating func put(_ byte: UInt8) {
        base.storeBytes(of: byte, toByteOffset: cursor, as: UInt8.self)
        cursor += 1
    }

    @inline(__always)
    mutating func putBigEndian(_ v: UInt64, size: Int) {
        storeBigEndian(v, size: size, at: base + cursor)
        cursor += size
    }

    mutating func putBytes(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { putRaw($0) }
    }

    @inline(__always)
    mutating func putRaw(_ bytes: UnsafeRawBufferPointer) {
        guard let source = bytes.baseAddress, !bytes.isEmpty else { return }
        (base + cursor).copyMemory(from: source, byteCount: bytes.count)
        cursor += bytes.count
    }

    mutating func putInteger(_ i: Int64) {
        if i < 0 {
            put(0x13)
            putBigEndian(UInt64(bitPattern: i), size: 8)
            return
        }
        let width = byteWidth(UInt64(i))
        put(0x10 | UInt8(width.trailingZeroBitCount))
        putBigEndian(UInt64(i), size: width)
    }

    mutating func putHeader(_ marker: UInt8, count: Int) {
        if count < 15 {
            put(marker | UInt8(count))
        } else {
            put(marker | 0x0F)
            putInteger(Int64(count))
        }
    }

    mutating func putString(_ s: String) {
        let (ascii, count) = stringShape(s)
        if ascii {
            putHeader(0x50, count: count)
            if s.utf8.withContiguousStorageIfAvailable({ putRaw(UnsafeRawBufferPointer($0)) }) == nil {
                var copy = s
                copy.withUTF8 { putRaw(UnsafeRawBufferPointer($0)) }
            }
        } else {
            putHeader(0x60, count: count)
            for u in s.utf16 { putBigEndian(UInt64(u), size: 2) }
        }
    }
}

/// Stores the low `size` bytes of `v` (1, 2, 4 or 8) big-endian at `p`, which need not be aligned.
@inline(__always)
func storeBigEndian(_ v: UInt64, size: Int, at p: UnsafeMutableRawPointer) {
    switch size {
    case 1: p.storeBytes(of: UInt8(truncatingIfNeeded: v), as: UInt8.self)
    case 2: p.storeBytes(of: UInt16(truncatingIfNeeded: v).bigEndian, as: UInt16.self)
    case 4: p.storeBytes(of: UInt32(truncatingIfNeeded: v).bigEndian, as: UInt32.self)
    default: p.storeBytes(of: v.bigEndian, as: UInt64.self)
    }
}

/// Zeros to grow a buffer by, copied rather than appended one by one: an element-wise append of a 1 MiB payload
/// took tens of milliseconds in an unoptimized (test) build.
private let zeroChunk = [UInt8](repeating: 0, count: 1 << 16)

/// Appends `count` zero bytes to `out`, a chunk at a time.
/// (No `reserveCapacity`: an exact reservation on every frame would defeat the array's geometric growth when a
/// connection's output appends frame after frame.)
func appendZeros(_ count: Int, to out: inout [UInt8]) {
    var remaining = count
    zeroChunk.withUnsafeBufferPointer { zeros in
        while remaining > 0 {
            let n = min(remaining, zeros.count)
            out.append(contentsOf: UnsafeBufferPointer(rebasing: zeros[0..<n]))
            remaining -= n
        }
    }
}

/// "bplist00", allocated once.
let bplistMagic: [UInt8] = Array("bplist00".utf8)

/// The smallest of 1, 2, 4 or 8 bytes that holds `v` unsigned.
@inline(__always)
func byteWidth(_ v: UInt64) -> Int {
    if v <= 0xFF { return 1 }
    if v <= 0xFFFF { return 2 }
    if v <= 0xFFFF_FFFF { return 4 }
    return 8
}
