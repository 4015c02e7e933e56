// Decoder for binary property lists (bplist00) from untrusted bytes.
//
// Layout: "bplist00", the objects, an offset table (one big-endian offset per object), and a 32-byte trailer
// (offset size, reference size, object count, top object, offset-table offset). Every size read from the input
// is checked against the bytes actually present before it is used, so a lying header cannot make us allocate or
// read out of bounds. Shared objects are decoded once per reference, so two budgets stop a small payload from
// expanding: a node budget (WireLimits.maxObjects) and a byte budget (WireLimits.decodedBytesBudget) that
// charges every value its size and grows only in proportion to the payload. Cycle detection is O(1) per
// container (an on-path flag per object), so deep nesting costs linear time, not quadratic.

/// Decodes bplist00 payloads into `PlistValue`s.
public enum BinaryPlistDecoder {
    /// Decodes one bplist00 payload.
    ///
    /// - Parameters:
    ///   - bytes: The payload (no frame header).
    ///   - limits: Depth and object-count bounds.
    /// - Returns: The top-level value.
    /// - Throws: `WireError` describing the first problem found; never traps on malformed input.
    public static func decode(_ bytes: UnsafeRawBufferPointer, limits: WireLimits = .default) throws(WireError)
        -> PlistValue
    {
        var cost = 0
        return try decode(bytes, limits: limits, decodedBytes: &cost)
    }

    /// Decodes one bplist00 payload and reports what the decoded value was charged against the byte budget
    /// (about what it occupies in memory), so a receiver can account for what it holds.
    public static func decode(_ bytes: UnsafeRawBufferPointer, limits: WireLimits, decodedBytes: inout Int)
        throws(WireError) -> PlistValue
    {
        var reader = try BinaryPlistReader(bytes, limits: limits)
        let budget = reader.byteBudget
        defer { decodedBytes = budget - reader.byteBudget }
        // The closure-taking stdlib helpers rethrow untyped errors, so the typed result is carried out in a Result.
        var result: Result<PlistValue, WireError> = .failure(WireError(.truncated, "not decoded"))
        withUnsafeTemporaryAllocation(of: Bool.self, capacity: reader.objectCount) { onPath in
            onPath.initialize(repeating: false)
            reader.onPath = onPath
            result = Result { () throws(WireError) in try reader.value(object: reader.topObject, depth: 0) }
        }
        return try result.get()
    }

    /// Decodes one bplist00 payload held in an array.
    public static func decode(_ bytes: [UInt8], limits: WireLimits = .default) throws(WireError) -> PlistValue {
        let result = bytes.withUnsafeBytes { buffer in
            Result { () throws(WireError) in try decode(buffer, limits: limits) }
        }
        return try result.get()
    }
}

private let magic: [UInt8] = Array("bplist00".utf8)
private let trailerSize = 32

/// Reads one payload: `value` decodes, `skim` (ForwardScan.swift) only checks. Both visit and charge the same
/// objects in the same order, so a payload one accepts the other accepts.
struct BinaryPlistReader {
    let base: UnsafeRawBufferPointer
    let offsetSize: Int
    let refSize: Int
    let objectCount: Int
    let topObject: Int
    /// Objects live in [8, objectsEnd); the offset table starts at objectsEnd.
    let objectsEnd: Int
    let maxDepth: Int
    var budget: Int
    /// Bytes the decoded values may still take (see `WireLimits.decodedBytesBudget`).
    var byteBudget: Int
    /// For each object, whether it is a container on the path being decoded (cycle detection).
    var onPath: UnsafeMutableBufferPointer<Bool> = .init(start: nil, count: 0)
    /// What one decoded value is charged on top of its bytes: its slot in the array or dictionary that holds it.
    static let valueCost = MemoryLayout<PlistValue>.stride
    /// What a heap buffer costs beyond its contents: the object's header, count and capacity (32 bytes), and
    /// malloc's own word and rounding. A non-empty array or data, and a string past the 15 UTF-8 bytes a Swift
    /// string holds inline, each make one. (Charged at 16 bytes a value and nothing for its storage, 50,000
    /// references to one 1-element array held 88 bytes each, charged 32; DecodedSizeTests.)
    static let storageCost = 64
    /// What a non-empty dictionary's storage costs beyond a heap buffer's: its hash table's own fields and bitmap.
    static let dictionaryCost = 40
    /// What each entry of a dictionary costs beyond its key's and value's slots (each charged `valueCost`): the
    /// empty buckets around it, the table being at most three quarters full (1.33 to 2.67 buckets an entry).
    static let dictionaryEntryCost = 64
    /// What each item of a message's `items` becomes: an `ExtensionItem`. Charged by `ForwardScan`'s walk (which
    /// builds the item, not its dictionary) and by `IncomingDescriptors.message(from:decodedBytes:budget:)`
    /// (which builds it from the decoded dictionary). Charged 16 bytes, 3.9 M references to one empty dictionary
    /// in a `complete`'s items passed the 64 MiB budget and built ~790 MB (203 bytes an item, DecodedSizeTests).
    static let itemCost = MemoryLayout<ExtensionItem>.stride

    /// What building an array of `count` elements holds beyond their slots: charged where one is built (`value`;
    /// `skim` charges what `value` would). The walk that reads a message's items builds no array of them.
    @inline(__always)
    static func storage(ofArray count: Int) -> Int { count > 0 ? storageCost : 0 }

    /// What building a dictionary of `count` entries holds beyond their keys' and values' slots, charged as an
    /// array's is. The walk builds no dictionary for a message or its items.
    @inline(__always)
    static func storage(ofDictionary count: Int) -> Int {
        count > 0 ? storageCost + dictionaryCost + count * dictionaryEntryCost : 0
    }

    init(_ base: UnsafeRawBufferPointer, limits: WireLimits) throws(WireError) {
        self.base = base
        guard base.count >= magic.count + trailerSize + 1 else {
            if base.count >= magic.count, !base.starts(with: magic) {
                throw WireError(.badMagic, "payload does not start with bplist00")
            }
            throw WireError(.truncated, "payload is \(base.count) bytes; a bplist needs at least 41")
        }
        guard base.starts(with: magic) else { throw WireError(.badMagic, "payload does not start with bplist00") }
        let t = base.count - trailerSize
        offsetSize = Int(base[t + 6])
        refSize = Int(base[t + 7])
        let count = Self.bigEndian(base, at: t + 8, size: 8)
        let top = Self.bigEndian(base, at: t + 16, size: 8)
        let tableOffset = Self.bigEndian(base, at: t + 24, size: 8)
        guard (1...8).contains(offsetSize), (1...8).contains(refSize) else {
            throw WireError(.badTrailer, "offset size \(offsetSize) / reference size \(refSize) not in 1...8")
        }
        guard count >= 1 else { throw WireError(.badTrailer, "object count is 0") }
        guard count <= UInt64(limits.maxObjects) else {
            throw WireError(.tooManyObjects, "payload declares \(count) objects; the limit is \(limits.maxObjects)")
        }
        guard top < count else { throw WireError(.badTrailer, "top object \(top) >= object count \(count)") }
        // The offset table must sit between the header and the trailer and hold exactly `count` entries.
        guard tableOffset >= UInt64(magic.count + 1), tableOffset <= UInt64(t),
            count <= (UInt64(t) - tableOffset) / UInt64(offsetSize)
        else {
            throw WireError(
                .badTrailer, "offset table at \(tableOffset) with \(count) entries of \(offsetSize) bytes "
                    + "does not fit before the trailer at \(t)")
        }
        if refSize < 8, (UInt64(1) << UInt64(refSize * 8)) < count {
            throw WireError(.badTrailer, "\(count) objects cannot be addressed with \(refSize)-byte references")
        }
        objectCount = Int(count)
        topObject = Int(top)
        objectsEnd = Int(tableOffset)
        maxDepth = limits.maxDepth
        budget = limits.maxObjects
        byteBudget = limits.decodedBytesBudget(payloadBytes: base.count)
    }

    /// Charges `bytes` to the byte budget.
    @inline(__always)
    mutating func charge(_ bytes: Int, for object: Int) throws(WireError) {
        byteBudget -= bytes
        guard byteBudget >= 0 else {
            throw WireError(.tooManyObjects, "object \(object): payload expands past its decoded-size budget "
                + "(shared objects referenced too often)")
        }
    }

    @inline(__always)
    static func bigEndian(_ base: UnsafeRawBufferPointer, at position: Int, size: Int) -> UInt64 {
        var v: UInt64 = 0
        for i in 0..<size { v = (v << 8) | UInt64(base[position + i]) }
        return v
    }

    @inline(__always)
    func offset(of object: Int) throws(WireError) -> Int {
        let raw = Self.bigEndian(base, at: objectsEnd + object * offsetSize, size: offsetSize)
        guard raw >= UInt64(magic.count), raw < UInt64(objectsEnd) else {
            throw WireError(.offsetOutOfRange, "object \(object) has offset \(raw) outside 8..<\(objectsEnd)")
        }
        return Int(raw)
    }

    @inline(__always)
    func ref(at position: Int) throws(WireError) -> Int {
        let r = Self.bigEndian(base, at: position, size: refSize)
        guard r < UInt64(objectCount) else {
            throw WireError(.objectRefOutOfRange, "reference \(r) at byte \(position) >= object count \(objectCount)")
        }
        return Int(r)
    }

    /// Checks that `length` bytes starting at `start` lie inside the object area.
    @inline(__always)
    func require(_ start: Int, _ length: Int, for object: Int) throws(WireError) {
        guard length >= 0, start <= objectsEnd, length <= objectsEnd - start else {
            throw WireError(
                .offsetOutOfRange, "object \(object) needs \(length) bytes at \(start), past the object area end \(objectsEnd)")
        }
    }

    /// Reads the element count of a data/string/array/dict object and where its payload starts.
    func count(low: UInt8, at offset: Int, object: Int) throws(WireError) -> (count: Int, start: Int) {
        if low != 0x0F { return (Int(low), offset + 1) }
        try require(offset + 1, 1, for: object)
        let marker = base[offset + 1]
        guard marker >> 4 == 0x1, marker & 0x0F <= 3 else {
            throw WireError(.invalidObject, "object \(object): length marker 0x\(hex(marker)) is not an integer")
        }
        let size = 1 << Int(marker & 0x0F)
        try require(offset + 2, size, for: object)
        let n = Self.bigEndian(base, at: offset + 2, size: size)
        guard n <= UInt64(objectsEnd) else {
            throw WireError(.offsetOutOfRange, "object \(object): length \(n) exceeds the payload")
        }
        return (Int(n), offset + 2 + size)
    }

    /// One object's marker and length checked and charged: what `value` builds from and `skim` walks. Scalars
    /// are read whole; strings and data are ranges of the payload; containers are their reference lists, not yet
    /// entered.
    enum Object {
        case bool(Bool)
        case integer(Int64)
        case real(Double)
        case date(Double)
        case data(Range<Int>)
        case ascii(Range<Int>)
        case utf16(start: Int, units: Int)
        case array(count: Int, start: Int)
        case dictionary(count: Int, start: Int)
    }

    /// Reads `object`'s header, charging it to both budgets and checking that everything it spans is in the
    /// payload (for a container, its references; the objects they name are checked as they are visited).
    @inline(__always)
    mutating func header(of object: Int) throws(WireError) -> Object {
        budget -= 1
        guard budget >= 0 else {
            throw WireError(.tooManyObjects, "payload expands to more than the limit of values (shared objects)")
        }
        try charge(Self.valueCost, for: object)
        let off = try offset(of: object)
        let marker = base[off]
        let low = marker & 0x0F
        switch marker >> 4 {
        case 0x0:
            switch low {
            case 0x8: return .bool(false)
            case 0x9: return .bool(true)
            default: throw WireError(.unsupportedObject, "object \(object): marker 0x\(hex(marker)) (null/fill)")
            }
        case 0x1:
            guard low <= 4 else { throw WireError(.invalidObject, "object \(object): integer size nibble \(low)") }
            let size = 1 << Int(low)
            try require(off + 1, size, for: object)
            if size == 16 {
                // 128-bit: accepted only when it is a sign extension of a 64-bit value.
                let hi = Self.bigEndian(base, at: off + 1, size: 8)
                let lo = Self.bigEndian(base, at: off + 9, size: 8)
                let v = Int64(bitPattern: lo)
                guard (hi == 0 && v >= 0) || (hi == UInt64.max && v < 0) else {
                    throw WireError(.integerOutOfRange, "object \(object): 128-bit integer outside Int64")
                }
                return .integer(v)
            }
            let raw = Self.bigEndian(base, at: off + 1, size: size)
            return .integer(Int64(bitPattern: raw))  // 1/2/4-byte values are unsigned; 8-byte is two's complement
        case 0x2:
            switch low {
            case 2:
                try require(off + 1, 4, for: object)
                return .real(Double(Float(bitPattern: UInt32(Self.bigEndian(base, at: off + 1, size: 4)))))
            case 3:
                try require(off + 1, 8, for: object)
                return .real(Double(bitPattern: Self.bigEndian(base, at: off + 1, size: 8)))
            default: throw WireError(.invalidObject, "object \(object): real size nibble \(low)")
            }
        case 0x3:
            guard low == 3 else { throw WireError(.invalidObject, "object \(object): date marker 0x\(hex(marker))") }
            try require(off + 1, 8, for: object)
            return .date(Double(bitPattern: Self.bigEndian(base, at: off + 1, size: 8)))
        case 0x4:
            let (n, start) = try count(low: low, at: off, object: object)
            try require(start, n, for: object)
            try charge(n > 0 ? n + Self.storageCost : 0, for: object)
            return .data(start..<start + n)
        case 0x5:
            let (n, start) = try count(low: low, at: off, object: object)
            try require(start, n, for: object)
            try charge(n > 15 ? n + Self.storageCost : n, for: object)
            if let b = firstNonASCII(UnsafeRawBufferPointer(rebasing: base[start..<start + n])) {
                throw WireError(.invalidObject, "object \(object): byte 0x\(hex(b)) in an ASCII string")
            }
            return .ascii(start..<start + n)
        case 0x6:
            let (n, start) = try count(low: low, at: off, object: object)
            guard n <= (objectsEnd - start) / 2 else {
                throw WireError(.offsetOutOfRange, "object \(object): string of \(n) UTF-16 units overruns the object area")
            }
            try charge(3 * n + (n > 5 ? Self.storageCost : 0), for: object)  // up to 3 UTF-8 bytes per UTF-16 unit
            return .utf16(start: start, units: n)
        case 0xA:
            let (n, start) = try count(low: low, at: off, object: object)
            guard n <= (objectsEnd - start) / refSize else {
                throw WireError(.offsetOutOfRange, "object \(object): array of \(n) references overruns the object area")
            }
            return .array(count: n, start: start)
        case 0xD:
            let (n, start) = try count(low: low, at: off, object: object)
            guard n <= (objectsEnd - start) / (2 * refSize) else {
                throw WireError(.offsetOutOfRange, "object \(object): dictionary of \(n) entries overruns the object area")
            }
            return .dictionary(count: n, start: start)
        default:
            throw WireError(.unsupportedObject, "object \(object): marker 0x\(hex(marker)) (UID, set or unknown)")
        }
    }

    mutating func value(object: Int, depth: Int) throws(WireError) -> PlistValue {
        switch try header(of: object) {
        case .bool(let b): return .bool(b)
        case .integer(let i): return .integer(i)
        case .real(let r): return .real(r)
        case .date(let seconds): return .date(PlistDate(secondsSinceReferenceDate: seconds))
        case .data(let range): return .data(Array(UnsafeRawBufferPointer(rebasing: base[range])))
        case .ascii(let range): return .string(String(decoding: UnsafeRawBufferPointer(rebasing: base[range]), as: UTF8.self))
        case .utf16(let start, let units): return .string(utf16BigEndian(start: start, units: units))
        case .array(let n, let start):
            try enter(object: object, depth: depth)
            try charge(Self.storage(ofArray: n), for: object)
            var elements: [PlistValue] = []
            elements.reserveCapacity(n)
            for i in 0..<n {
                elements.append(try value(object: try ref(at: start + i * refSize), depth: depth + 1))
            }
            onPath[object] = false
            return .array(elements)
        case .dictionary(let n, let start):
            try enter(object: object, depth: depth)
            try charge(Self.storage(ofDictionary: n), for: object)
            var entries: [String: PlistValue] = [:]
            // Not for none: reserving room for 0 gave an empty dictionary storage of its own (~120 bytes).
            if n > 0 { entries.reserveCapacity(n) }
            for i in 0..<n {
                let keyObject = try ref(at: start + i * refSize)
                guard case .string(let key) = try value(object: keyObject, depth: depth + 1) else {
                    throw WireError(.invalidKey, "object \(object): key \(i) (object \(keyObject)) is not a string")
                }
                entries[key] = try value(object: try ref(at: start + (n + i) * refSize), depth: depth + 1)
            }
            onPath[object] = false
            return .dictionary(entries)
        }
    }

    /// Checks `object` and everything under it exactly as `value` would decode it, building nothing. Returns the
    /// object's header, so a caller can require a kind.
    @discardableResult
    mutating func skim(object: Int, depth: Int) throws(WireError) -> Object {
        let kind = try header(of: object)
        switch kind {
        case .bool, .integer, .real, .date, .data, .ascii, .utf16: break
        case .array(let n, let start):
            try enter(object: object, depth: depth)
            try charge(Self.storage(ofArray: n), for: object)
            for i in 0..<n { try skim(object: try ref(at: start + i * refSize), depth: depth + 1) }
            onPath[object] = false
        case .dictionary(let n, let start):
            try enter(object: object, depth: depth)
            try charge(Self.storage(ofDictionary: n), for: object)
            for i in 0..<n {
                let keyObject = try ref(at: start + i * refSize)
                switch try header(of: keyObject) {
                case .ascii, .utf16: break
                default: throw WireError(.invalidKey, "object \(object): key \(i) (object \(keyObject)) is not a string")
                }
                try skim(object: try ref(at: start + (n + i) * refSize), depth: depth + 1)
            }
            onPath[object] = false
        }
        return kind
    }

    /// Marks `object` as on the current path; rejects nesting past the limit and containers that contain
    /// themselves. The caller clears the mark when the container is done.
    @inline(__always)
    mutating func enter(object: Int, depth: Int) throws(WireError) {
        guard depth < maxDepth else {
            throw WireError(.tooDeep, "object \(object): nesting deeper than the limit of \(maxDepth)")
        }
        guard !onPath[object] else {
            throw WireError(.cycle, "object \(object) contains itself (at depth \(depth))")
        }
        onPath[object] = true
    }

    func utf16BigEndian(start: Int, units: Int) -> String {
        var codeUnits: [UInt16] = []
        codeUnits.reserveCapacity(units)
        for i in 0..<units {
            codeUnits.append(UInt16(base[start + 2 * i]) << 8 | UInt16(base[start + 2 * i + 1]))
        }
        return String(decoding: codeUnits, as: UTF16.self)
    }
}

@inline(never)
func hex(_ byte: UInt8) -> String {
    let s = String(byte, radix: 16)
    return s.count == 1 ? "0" + s : s
}
