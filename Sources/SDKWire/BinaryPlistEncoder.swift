// Encoder for binary property lists (bplist00).
//
// Two passes over the value tree and no intermediate object list: the first counts objects (which fixes the
// reference width), the second writes each object once. A container reserves consecutive indices for its
// children, writes their references, then writes the children, so an object's index is known before its bytes
// are. Objects are not deduplicated: messages are small trees and hashing costs more than it saves. Strings are
// ASCII when they can be and UTF-16BE otherwise, as Foundation and plistlib write them.

/// Encodes `PlistValue`s as bplist00. Reuse one encoder to avoid re-allocating its scratch space.
public struct BinaryPlistEncoder: Sendable {
    private var offsets: [Int] = []

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
        let objectCount = Self.countObjects(value)
        let start = out.count
        offsets.removeAll(keepingCapacity: true)
        offsets.reserveCapacity(objectCount)
        offsets.append(contentsOf: repeatElement(0, count: objectCount))
        out.reserveCapacity(start + 64 + objectCount * 12)
        out.append(contentsOf: bplistMagic)
        let writer = Writer(refSize: byteWidth(UInt64(objectCount)), start: start)
        var next = 1
        offsets.withUnsafeMutableBufferPointer { table in
            writer.write(value, index: 0, next: &next, offsets: table, out: &out)
        }
        let tableOffset = out.count - start
        let offsetSize = byteWidth(UInt64(tableOffset))
        for offset in offsets { appendBigEndian(UInt64(offset), size: offsetSize, to: &out) }
        out.append(contentsOf: repeatElement(0, count: 6))
        out.append(UInt8(offsetSize))
        out.append(UInt8(writer.refSize))
        appendBigEndian(UInt64(objectCount), size: 8, to: &out)
        appendBigEndian(0, size: 8, to: &out)  // top object
        appendBigEndian(UInt64(tableOffset), size: 8, to: &out)
    }

    /// The number of bplist objects `value` encodes to (dictionary keys are objects too).
    static func countObjects(_ value: PlistValue) -> Int {
        switch value {
        case .array(let elements):
            var n = 1
            for e in elements { n += countObjects(e) }
            return n
        case .dictionary(let entries):
            var n = 1 + entries.count
            for (_, v) in entries { n += countObjects(v) }
            return n
        default:
            return 1
        }
    }
}

private struct Writer {
    let refSize: Int
    let start: Int

    init(refSize: Int, start: Int) {
        self.refSize = refSize
        self.start = start
    }

    func write(
        _ value: PlistValue, index: Int, next: inout Int, offsets: UnsafeMutableBufferPointer<Int>,
        out: inout [UInt8]
    ) {
        offsets[index] = out.count - start
        switch value {
        case .bool(let b):
            out.append(b ? 0x09 : 0x08)
        case .integer(let i):
            writeInteger(i, to: &out)
        case .real(let d):
            out.append(0x23)
            appendBigEndian(d.bitPattern, size: 8, to: &out)
        case .date(let d):
            out.append(0x33)
            appendBigEndian(d.secondsSinceReferenceDate.bitPattern, size: 8, to: &out)
        case .data(let bytes):
            writeHeader(0x40, count: bytes.count, to: &out)
            out.append(contentsOf: bytes)
        case .string(let s):
            writeString(s, to: &out)
        case .array(let elements):
            let base = next
            next += elements.count
            writeHeader(0xA0, count: elements.count, to: &out)
            for i in 0..<elements.count { appendBigEndian(UInt64(base + i), size: refSize, to: &out) }
            for (i, e) in elements.enumerated() { write(e, index: base + i, next: &next, offsets: offsets, out: &out) }
        case .dictionary(let entries):
            let n = entries.count
            let base = next
            next += 2 * n
            writeHeader(0xD0, count: n, to: &out)
            for i in 0..<(2 * n) { appendBigEndian(UInt64(base + i), size: refSize, to: &out) }
            // Keys take indices base..<base+n and values base+n..<base+2n, in the dictionary's iteration order.
            var i = 0
            for key in entries.keys {
                offsets[base + i] = out.count - start
                writeString(key, to: &out)
                i += 1
            }
            i = 0
            for v in entries.values {
                write(v, index: base + n + i, next: &next, offsets: offsets, out: &out)
                i += 1
            }
        }
    }

    func writeInteger(_ i: Int64, to out: inout [UInt8]) { appendPlistInteger(i, to: &out) }

    func writeHeader(_ marker: UInt8, count: Int, to out: inout [UInt8]) {
        if count < 15 {
            out.append(marker | UInt8(count))
        } else {
            out.append(marker | 0x0F)
            writeInteger(Int64(count), to: &out)
        }
    }

    func writeString(_ s: String, to out: inout [UInt8]) {
        var s = s
        s.withUTF8 { utf8 in
            var ascii = true
            for b in utf8 where b >= 0x80 {
                ascii = false
                break
            }
            if ascii {
                writeHeader(0x50, count: utf8.count, to: &out)
                out.append(contentsOf: utf8)
            } else {
                let units = String(decoding: utf8, as: UTF8.self).utf16
                writeHeader(0x60, count: units.count, to: &out)
                for u in units {
                    out.append(UInt8(u >> 8))
                    out.append(UInt8(u & 0xFF))
                }
            }
        }
    }
}

/// "bplist00", allocated once.
let bplistMagic: [UInt8] = Array("bplist00".utf8)

/// An integer object: the fewest of 1, 2, 4 or 8 bytes for a non-negative value, 8 for a negative one.
@inline(__always)
func appendPlistInteger(_ i: Int64, to out: inout [UInt8]) {
    if i < 0 {
        out.append(0x13)
        appendBigEndian(UInt64(bitPattern: i), size: 8, to: &out)
        return
    }
    let width = byteWidth(UInt64(i))
    out.append(0x10 | UInt8(width.trailingZeroBitCount))
    appendBigEndian(UInt64(i), size: width, to: &out)
}

/// The smallest of 1, 2, 4 or 8 bytes that holds `v` unsigned.
@inline(__always)
func byteWidth(_ v: UInt64) -> Int {
    if v <= 0xFF { return 1 }
    if v <= 0xFFFF { return 2 }
    if v <= 0xFFFF_FFFF { return 4 }
    return 8
}

@inline(__always)
func appendBigEndian(_ v: UInt64, size: Int, to out: inout [UInt8]) {
    var shift = (size - 1) * 8
    while shift >= 0 {
        out.append(UInt8(truncatingIfNeeded: v >> UInt64(shift)))
        shift -= 8
    }
}
