// Hand-built malformed payloads: each defect maps to its own WireError code.
import Testing
import SDKWire

/// Builds a bplist from raw object bytes, so tests can state exactly which field is wrong.
func handBuilt(
    objects: [[UInt8]], top: UInt64 = 0, offsetSize: UInt8 = 1, refSize: UInt8 = 1,
    countOverride: UInt64? = nil, tableOffsetOverride: UInt64? = nil, offsetsOverride: [Int]? = nil
) -> [UInt8] {
    var out = Array("bplist00".utf8)
    var offsets: [Int] = []
    for o in objects {
        offsets.append(out.count)
        out += o
    }
    let tableOffset = out.count
    for off in offsetsOverride ?? offsets {
        for shift in stride(from: (max(Int(offsetSize), 1) - 1) * 8, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: off >> shift)) }
    }
    out += [0, 0, 0, 0, 0, 0, offsetSize, refSize]
    func be64(_ v: UInt64) -> [UInt8] { (0..<8).reversed().map { UInt8(truncatingIfNeeded: v >> (UInt64($0) * 8)) } }
    out += be64(countOverride ?? UInt64(objects.count)) + be64(top) + be64(tableOffsetOverride ?? UInt64(tableOffset))
    return out
}

func decodeError(_ bytes: [UInt8], limits: WireLimits = .default) -> WireError? {
    do {
        _ = try BinaryPlistDecoder.decode(bytes, limits: limits)
        return nil
    } catch {
        return error
    }
}

@Suite struct LimitTests {
    @Test func handBuiltValidPayloadDecodes() throws {
        #expect(try BinaryPlistDecoder.decode(handBuilt(objects: [[0xA2, 1, 1], [0x10, 7]])) == [7, 7])
    }

    @Test func badMagic() {
        var bytes = BinaryPlistEncoder.encode("x")
        bytes[7] = UInt8(ascii: "1")
        #expect(decodeError(bytes)?.code == .badMagic)
        #expect(decodeError(Array("<?xml version".utf8))?.code == .badMagic)
    }

    @Test func truncatedPayload() {
        #expect(decodeError([])?.code == .truncated)
        #expect(decodeError(Array("bplist00".utf8) + [0x10, 1])?.code == .truncated)
    }

    @Test func trailerThatDoesNotFit() {
        #expect(decodeError(handBuilt(objects: [[0x09]], offsetSize: 0))?.code == .badTrailer)
        #expect(decodeError(handBuilt(objects: [[0x09]], refSize: 9))?.code == .badTrailer)
        #expect(decodeError(handBuilt(objects: [[0x09]], top: 1))?.code == .badTrailer)
        #expect(decodeError(handBuilt(objects: [[0x09]], countOverride: 0))?.code == .badTrailer)
        // A claimed count of 2^40 objects is rejected against the bytes present, before any allocation.
        #expect(decodeError(handBuilt(objects: [[0x09]], countOverride: 1 << 40), limits: WireLimits(maxObjects: .max))?.code == .badTrailer)
        #expect(decodeError(handBuilt(objects: [[0x09]], tableOffsetOverride: 1 << 62))?.code == .badTrailer)
        #expect(decodeError(handBuilt(objects: [[0x09]], tableOffsetOverride: 3))?.code == .badTrailer)
        // 300 objects cannot be named with 1-byte references.
        let many = handBuilt(objects: Array(repeating: [0x09], count: 300), offsetSize: 2, refSize: 1)
        #expect(decodeError(many)?.code == .badTrailer)
    }

    @Test func offsetOutOfRange() {
        #expect(decodeError(handBuilt(objects: [[0x09]], offsetsOverride: [200]))?.code == .offsetOutOfRange)
        #expect(decodeError(handBuilt(objects: [[0x09]], offsetsOverride: [2]))?.code == .offsetOutOfRange)
        // A string claiming more bytes than the object area holds.
        #expect(decodeError(handBuilt(objects: [[0x5F, 0x12, 0x7F, 0xFF, 0xFF, 0xFF]]))?.code == .offsetOutOfRange)
        // An array whose references run past the object area.
        #expect(decodeError(handBuilt(objects: [[0xAF, 0x11, 0xFF, 0xFF]]))?.code == .offsetOutOfRange)
    }

    @Test func objectReferenceOutOfRange() {
        #expect(decodeError(handBuilt(objects: [[0xA1, 5]]))?.code == .objectRefOutOfRange)
    }

    @Test func referenceCycles() {
        #expect(decodeError(handBuilt(objects: [[0xA1, 0]]))?.code == .cycle)
        // dict -> array -> dict
        #expect(decodeError(handBuilt(objects: [[0xD1, 2, 1], [0xA1, 0], [0x51, 0x6B]]))?.code == .cycle)
    }

    @Test func nestingTooDeep() {
        var nested: PlistValue = "leaf"
        for _ in 0..<20 { nested = [nested] }
        let bytes = BinaryPlistEncoder.encode(nested)
        #expect(decodeError(bytes, limits: WireLimits(maxDepth: 10))?.code == .tooDeep)
        #expect(decodeError(bytes, limits: WireLimits(maxDepth: 20)) == nil)
    }

    @Test func tooManyObjects() {
        let bytes = BinaryPlistEncoder.encode(.array(Array(repeating: 1, count: 1000)))
        #expect(decodeError(bytes, limits: WireLimits(maxObjects: 500))?.code == .tooManyObjects)
        #expect(decodeError(bytes, limits: WireLimits(maxObjects: 1001)) == nil)
    }

    @Test func sharedObjectExpansionIsBounded() {
        // Object k is an array of 8 references to object k+1: 30 objects that expand to 8^29 values.
        var objects: [[UInt8]] = (0..<29).map { k in [0xA8] + Array(repeating: UInt8(k + 1), count: 8) }
        objects.append([0x10, 1])
        let bytes = handBuilt(objects: objects, offsetSize: 2)
        #expect(decodeError(bytes, limits: WireLimits(maxObjects: 100_000))?.code == .tooManyObjects)
    }

    @Test func sharedStringsCannotAmplifyAFrame() {
        // 64 KiB of data referenced 4096 times: 66 KB on the wire, 256 MiB if each reference were expanded.
        // Within the object limit, so only the byte budget stops it (the first slice grew to GBs on this).
        let blob: [UInt8] = [0x4F, 0x12, 0x00, 0x01, 0x00, 0x00] + Array(repeating: 0x41, count: 65_536)
        let array: [UInt8] = [0xAF, 0x11, 0x10, 0x00] + Array(repeating: [0x00, 0x01], count: 4096).flatMap { $0 }
        let bytes = handBuilt(objects: [array, blob], offsetSize: 4, refSize: 2)
        let error = decodeError(bytes)
        #expect(error?.code == .tooManyObjects)
        #expect(error?.description.contains("budget") == true)
        // The same data referenced a few times decodes.
        let few: [UInt8] = [0xA4, 0x00, 0x01, 0x00, 0x01, 0x00, 0x01, 0x00, 0x01]
        #expect(decodeError(handBuilt(objects: [few, blob], offsetSize: 4, refSize: 2)) == nil)
    }

    @Test func deepSharedNestingIsLinearAndBounded() {
        // 510 levels, each an array of two references to the next: the first slice spent a second of CPU on
        // the O(depth) cycle check per value. Now the byte budget ends it after a few thousand values.
        let depth = 510
        var objects: [[UInt8]] = (0..<depth).map { k in
            let hi = UInt8((k + 1) >> 8), lo = UInt8((k + 1) & 0xFF)
            return [0xA2, hi, lo, hi, lo]
        }
        objects.append([0x10, 1])
        let bytes = handBuilt(objects: objects, offsetSize: 2, refSize: 2)
        let started = ContinuousClock.now
        #expect(decodeError(bytes)?.code == .tooManyObjects)
        // Not a timing goal; a sanity bound 100x above what it takes, so a regression to quadratic shows.
        #expect(ContinuousClock.now - started < .seconds(5))
    }

    @Test func budgetScalesWithThePayload() {
        let limits = WireLimits()
        #expect(limits.decodedBytesBudget(payloadBytes: 1000) == 64_000 + 65_536)
        #expect(limits.decodedBytesBudget(payloadBytes: 16 << 20) == 128 << 20)
        #expect(limits.decodedBytesBudget(payloadBytes: .max) == 128 << 20)
        // A typical message decodes well inside its budget.
        let item: PlistValue = ["title": "hello", "attachments": [], "userInfo": ["k": 1]]
        let message: PlistValue = ["type": "begin", "id": "6F9619FF-8B86-4011-B42D-00C04FC964FF",
                                   "items": .array(Array(repeating: item, count: 200))]
        #expect(decodeError(BinaryPlistEncoder.encode(message)) == nil)
    }

    @Test func malformedObjects() {
        #expect(decodeError(handBuilt(objects: [[0x00]]))?.code == .unsupportedObject)  // null
        #expect(decodeError(handBuilt(objects: [[0x80, 1]]))?.code == .unsupportedObject)  // UID
        #expect(decodeError(handBuilt(objects: [[0x15, 1]]))?.code == .invalidObject)  // 32-byte integer
        #expect(decodeError(handBuilt(objects: [[0x21, 1, 2]]))?.code == .invalidObject)  // 2-byte real
        #expect(decodeError(handBuilt(objects: [[0x52, 0x41, 0xC3]]))?.code == .invalidObject)  // non-ASCII
        #expect(decodeError(handBuilt(objects: [[0xD1, 1, 1], [0x10, 1]]))?.code == .invalidKey)
        let big = [0x14] + [0x00, 0, 0, 0, 0, 0, 0, 1] + [0, 0, 0, 0, 0, 0, 0, 0] as [UInt8]
        #expect(decodeError(handBuilt(objects: [big]))?.code == .integerOutOfRange)
    }

    @Test func signExtended128BitIntegerDecodes() throws {
        let minusTwo: [UInt8] = [0x14] + Array(repeating: 0xFF, count: 15) + [0xFE]
        #expect(try BinaryPlistDecoder.decode(handBuilt(objects: [minusTwo])) == -2)
    }

    @Test func errorsNameWhereTheyHappened() {
        let error = decodeError(handBuilt(objects: [[0xA2, 1, 9], [0x10, 1]]))
        #expect(error?.code == .objectRefOutOfRange)
        #expect(error?.description.contains("reference 9") == true)
    }
}
