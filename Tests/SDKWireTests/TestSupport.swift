// Helpers for the codec tests: the test seed and a random PlistValue builder (the seeded generator is
// HostTestSupport's).
import HostTestSupport
import SDKWire

/// The seed for randomized tests: SDKHOST_TEST_SEED when set, so a failure can be replayed, else a fixed one.
func testSeed(default value: UInt64) -> UInt64 {
    if let raw = environmentValue("SDKHOST_TEST_SEED"), let seed = UInt64(raw) { return seed }
    return value
}

enum RandomPlist {
    static let alphabet: [Character] = Array("abcXYZ 019_-éü日本😀𝄞\u{0}\n\"<&")

    static func value(_ g: inout SeededGenerator, depth: Int = 0) -> PlistValue {
        let leafOnly = depth >= 4
        switch Int.random(in: 0..<(leafOnly ? 6 : 8), using: &g) {
        case 0: return .string(string(&g))
        case 1: return .integer(integer(&g))
        case 2: return .real(real(&g))
        case 3: return .bool(Bool.random(using: &g))
        case 4: return .date(PlistDate(secondsSinceReferenceDate: Double(Int32.random(in: .min ... .max, using: &g)) / 4))
        case 5: return .data((0..<Int.random(in: 0..<40, using: &g)).map { _ in UInt8.random(in: 0...255, using: &g) })
        case 6: return .array((0..<Int.random(in: 0..<6, using: &g)).map { _ in value(&g, depth: depth + 1) })
        default:
            var d: [String: PlistValue] = [:]
            for _ in 0..<Int.random(in: 0..<6, using: &g) { d[string(&g)] = value(&g, depth: depth + 1) }
            return .dictionary(d)
        }
    }

    static func string(_ g: inout SeededGenerator) -> String {
        let n = Int.random(in: 0..<(Bool.random(using: &g) ? 8 : 40), using: &g)
        let asciiOnly = Bool.random(using: &g)
        return String((0..<n).map { _ in asciiOnly ? Character(UnicodeScalar(UInt8.random(in: 32...126, using: &g))) : alphabet.randomElement(using: &g)! })
    }

    static func integer(_ g: inout SeededGenerator) -> Int64 {
        // Bias toward the width boundaries, where encodings change.
        let edges: [Int64] = [0, 1, 14, 15, 255, 256, 65535, 65536, 4_294_967_295, 4_294_967_296, .max, .min, -1]
        if Bool.random(using: &g) { return edges.randomElement(using: &g)! }
        return Int64.random(in: .min ... .max, using: &g) >> Int64.random(in: 0..<63, using: &g)
    }

    static func real(_ g: inout SeededGenerator) -> Double {
        let specials: [Double] = [0, -0.0, .infinity, -.infinity, .nan, .leastNonzeroMagnitude, .greatestFiniteMagnitude]
        if Int.random(in: 0..<5, using: &g) == 0 { return specials.randomElement(using: &g)! }
        return Double(bitPattern: UInt64.random(in: 0 ... .max, using: &g))
    }
}

#if canImport(Glibc)
import Glibc
#endif
