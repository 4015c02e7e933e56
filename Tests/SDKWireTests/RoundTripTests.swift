// Round trips of hand-picked values, and checks of the exact bytes where the format fixes them.
import Testing
import SDKWire

@Suite struct RoundTripTests {
    static let samples: [PlistValue] = [
        "", "hello", "héllo", "😀 𝄞 日本", .string(String(repeating: "x", count: 70_000)),
        0, 1, 255, 256, 65_535, 65_536, 4_294_967_295, 4_294_967_296, .integer(.max), .integer(.min), -1,
        0.0, -0.0, 1.5, .real(.infinity), .real(.nan), true, false,
        .date(PlistDate(secondsSinceReferenceDate: 0)), .date(PlistDate(secondsSince1970: 1_790_000_000.25)),
        .data([]), .data([0, 1, 2]), .data(Array(repeating: 7, count: 100_000)),
        [], [:], [[], [:], [[]]], ["a": ["b": ["c": [1, 2, 3]]]],
    ]

    @Test(arguments: samples)
    func roundTrip(_ value: PlistValue) throws {
        let bytes = BinaryPlistEncoder.encode(value)
        #expect(Array(bytes.prefix(8)) == Array("bplist00".utf8))
        #expect(try BinaryPlistDecoder.decode(bytes) == value)
    }

    @Test func smallIntegerUsesOneByte() {
        // Header 8 + object 2 + offset table 1 + trailer 32.
        let bytes = BinaryPlistEncoder.encode(5)
        #expect(bytes.count == 43)
        #expect(bytes[8] == 0x10 && bytes[9] == 5)
    }

    @Test func negativeIntegerUsesEightBytes() {
        let bytes = BinaryPlistEncoder.encode(-2)
        #expect(bytes[8] == 0x13)
        #expect(Array(bytes[9..<17]) == [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE])
    }

    @Test func nonASCIIStringIsUTF16BigEndian() {
        let bytes = BinaryPlistEncoder.encode("é")
        #expect(Array(bytes[8..<11]) == [0x61, 0x00, 0xE9])
    }

    @Test func oneNonASCIICharacterAnywhereMakesTheStringUTF16() throws {
        // The encoder checks eight bytes at a time; a non-ASCII character in any position of a word or of the
        // tail must still switch the string to UTF-16, and an all-ASCII string of any length must stay ASCII.
        for length in 1...24 {
            let ascii = String(repeating: "a", count: length)
            let plain = BinaryPlistEncoder.encode(.string(ascii))
            #expect(plain[8] & 0xF0 == 0x50, "\(length) ASCII characters")
            for position in 0..<length {
                var characters = Array(ascii)
                characters[position] = "é"
                let string = String(characters)
                let bytes = BinaryPlistEncoder.encode(.string(string))
                #expect(bytes[8] & 0xF0 == 0x60, "é at \(position) of \(length)")
                #expect(try BinaryPlistDecoder.decode(bytes) == .string(string))
            }
        }
    }

    @Test func largeArrayWidensReferencesAndOffsets() throws {
        let value = PlistValue.array((0..<70_000).map { .integer(Int64($0)) })
        let bytes = BinaryPlistEncoder.encode(value)
        let trailer = bytes.suffix(32)
        #expect(trailer[trailer.startIndex + 6] == 4, "offsets past 64 KiB need 4 bytes")
        #expect(trailer[trailer.startIndex + 7] == 4, "70,001 objects need 4-byte references")
        #expect(try BinaryPlistDecoder.decode(bytes) == value)
    }

    @Test func encoderReuseAppendsAfterExistingBytes() throws {
        var encoder = BinaryPlistEncoder()
        var out: [UInt8] = [9, 9]
        encoder.encode(["k": "v"], appendingTo: &out)
        let first = out
        encoder.encode(["k": "v"], appendingTo: &out)
        #expect(Array(first[0..<2]) == [9, 9])
        #expect(try BinaryPlistDecoder.decode(Array(first.dropFirst(2))) == ["k": "v"])
        #expect(Array(out.dropFirst(first.count)) == Array(first.dropFirst(2)))
    }

    @Test func accessorsAndLiterals() {
        let v: PlistValue = ["n": 3, "s": "x", "a": [1.5, true]]
        #expect(v["n"]?.intValue == 3)
        #expect(v["s"]?.stringValue == "x")
        #expect(v["a"]?[0]?.doubleValue == 1.5)
        #expect(v["a"]?[1]?.boolValue == true)
        #expect(v["a"]?[2] == nil)
        #expect(v["missing"] == nil)
        #expect(v.kindName == "dictionary")
    }
}
