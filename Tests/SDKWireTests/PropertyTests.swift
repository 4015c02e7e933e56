// Randomized round trips (generated value -> encode -> decode -> equal) and mutation of valid encodings
// (flip, truncate, extend -> a value or a typed error, never a crash). Seeded; the seed is in every failure.
import Testing
import HostTestSupport
import SDKWire

@Suite struct PropertyTests {
    @Test func randomValuesRoundTrip() throws {
        let seed = testSeed(default: 0x5EED_0001)
        var g = SeededGenerator(seed: seed)
        var encoder = BinaryPlistEncoder()
        var failures = 0
        for i in 0..<10_000 {
            let value = RandomPlist.value(&g)
            var bytes: [UInt8] = []
            encoder.encode(value, appendingTo: &bytes)
            let decoded = try BinaryPlistDecoder.decode(bytes)
            if decoded != value {
                failures += 1
                Issue.record("case \(i) (SDKHOST_TEST_SEED=\(seed)): \(value) decoded as \(decoded)")
                if failures > 5 { break }
            }
        }
        #expect(failures == 0, "replay with SDKHOST_TEST_SEED=\(seed)")
    }

    @Test func mutatedEncodingsNeverCrash() {
        let seed = testSeed(default: 0x5EED_0002)
        var g = SeededGenerator(seed: seed)
        var decodedValues = 0
        var errors = 0
        for _ in 0..<3_000 {
            let valid = BinaryPlistEncoder.encode(RandomPlist.value(&g))
            for _ in 0..<4 {
                var bytes = valid
                switch Int.random(in: 0..<4, using: &g) {
                case 0:  // flip bits in random bytes, with extra weight on the trailer and offset table
                    for _ in 0..<Int.random(in: 1...4, using: &g) {
                        let index = Bool.random(using: &g)
                            ? Int.random(in: max(0, bytes.count - 48)..<bytes.count, using: &g)
                            : Int.random(in: 0..<bytes.count, using: &g)
                        bytes[index] ^= UInt8(1) << UInt8.random(in: 0..<8, using: &g)
                    }
                case 1:  // truncate
                    bytes.removeLast(Int.random(in: 1...bytes.count, using: &g))
                case 2:  // extend with junk
                    bytes += (0..<Int.random(in: 1...16, using: &g)).map { _ in UInt8.random(in: 0...255, using: &g) }
                default:  // overwrite a byte with a boundary value
                    bytes[Int.random(in: 0..<bytes.count, using: &g)] = [0x00, 0x0F, 0x7F, 0x80, 0xFF].randomElement(using: &g)!
                }
                do {
                    _ = try BinaryPlistDecoder.decode(bytes, limits: WireLimits(maxObjects: 100_000))
                    decodedValues += 1
                } catch {
                    errors += 1  // typed by construction: decode throws(WireError)
                }
            }
        }
        // Both outcomes must occur, or the mutations are not exercising the decoder.
        #expect(decodedValues > 0, "seed \(seed)")
        #expect(errors > 1_000, "seed \(seed)")
    }
}
