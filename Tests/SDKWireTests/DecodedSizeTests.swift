// The decoder's byte budget against the heap: a payload may reference one object many times (each reference is
// decoded anew), so what it is charged must be at least what decoding it builds, or a small frame builds far
// more than its budget. Charged 16 bytes a value, 3.9 M references to one empty dictionary in a `complete`'s
// items passed the 64 MiB budget and built ~790 MB (203 bytes an item: a `PlistValue`, the empty dictionary's
// storage that reserving room for none made, an `ExtensionItem`); a 1-entry dictionary held 184 bytes and was
// charged 49. These tests hold each decoded value and compare the heap malloc reports with the charge.
import CSDKShim
import HostTestSupport
@testable import SDKWire
import Testing

@Suite(.serialized) struct DecodedSizeTests {
    /// What the heap may grow by beyond the charge: one-time allocations, malloc's caches and another thread's
    /// allocations meanwhile (some charges are exact: a 16-character string, an empty item). Five bytes for each
    /// of the 50,000 references: 16 bytes a value, the old charge, was at least 8 under for every shape.
    static let slack = 256 << 10
    /// Limits that let a payload expand as far as it likes: the charge is compared, not enforced.
    static let open = WireLimits(maxObjects: 1 << 26, maxDecodedBytes: 1 << 40, maxExpansion: 1 << 20)

    /// A payload of `count` references to one object (`shared`, with `more` objects it refers to by index from
    /// 3 on): a top-level array of them, or with `message`, a `complete`'s items.
    static func payload(references count: Int, to shared: [UInt8], more: [[UInt8]] = [], message: Bool) -> [UInt8] {
        let header: [UInt8] = [0xAF, 0x12] + (0..<4).reversed().map { UInt8(truncatingIfNeeded: count >> ($0 * 8)) }
        let array = header + Array(repeating: UInt8(message ? 2 : 1), count: count)
        if message {
            // 0: the message, 1: the items, 2: the shared object, 3...: what it refers to, then its keys and values.
            let base = 3 + more.count
            let strings = ["type", "complete", "id", "6F9619FF-8B86-4011-B42D-00C04FC964FF", "items"]
            let objects = [[0xD3] + [base, base + 2, base + 4, base + 1, base + 3, 1].map { UInt8($0) }, array, shared]
                + more + strings.map { RawPlist.header(0x50, $0.utf8.count) + Array($0.utf8) }
            return handBuilt(objects: objects, top: 0, offsetSize: 4)
        }
        return handBuilt(objects: [array, shared] + more, top: 0, offsetSize: 4)
    }

    /// What the heap grew by while `make`'s result is held; the least of three tries, with what it was charged.
    /// Another thread of the test process that allocates meanwhile adds to it (the least of three leaves that out);
    /// one that frees could hide a charge too low, so the suite's command runs suites one at a time
    /// (`swift test --no-parallel`).
    static func held(_ make: (inout Int) -> Any?) -> (grew: Int, charged: Int)? {
        var least = Int.max, charged = 0
        for _ in 0..<3 {
            let before = Int(sdk_heap_bytes_in_use())
            var cost = 0
            guard let value = make(&cost) else { return nil }
            let grew = Int(sdk_heap_bytes_in_use()) - before
            withExtendedLifetime(value) {}
            least = min(least, grew)
            charged = cost
        }
        return (least, charged)
    }

    /// The shared objects, as item dictionaries: their keys and values come after them (indices 3...).
    static let items: [(String, [UInt8], [[UInt8]])] = [
        ("an empty dictionary", [0xD0], []),
        ("a title", [0xD1, 3, 4], [[0x55] + Array("title".utf8), [0x51, 0x78]]),
        ("a long title", [0xD1, 3, 4], [[0x55] + Array("title".utf8), [0x5F, 0x10, 20] + Array(repeating: 0x61, count: 20)]),
        ("a 1-entry userInfo", [0xD1, 3, 4], [[0x58] + Array("userInfo".utf8), [0xD1, 5, 6], [0x51, 0x6B], [0x10, 1]]),
        ("an attachment", [0xD1, 3, 4], [[0x5B] + Array("attachments".utf8), [0xA1, 5], [0x41, 0x01]]),
        ("a UTF-16 text", [0xD1, 3, 4], [[0x54] + Array("text".utf8), [0x67] + Array(repeating: [0x00, 0xE9], count: 7).flatMap { $0 }]),
    ]

    @Test(arguments: 0..<items.count)
    func anItemIsChargedWhatItsMessageBuilds(_ index: Int) throws {
        let (name, shared, more) = Self.items[index]
        let bytes = Self.payload(references: 50_000, to: shared, more: more, message: true)
        // As a receiver reads it when the walk does not take it: the tree, then the message built from it.
        let tree = try #require(Self.held { cost in
            bytes.withUnsafeBytes { payload -> Any? in
                guard let plist = try? BinaryPlistDecoder.decode(payload, limits: Self.open, decodedBytes: &cost) else { return nil }
                var incoming = IncomingDescriptors()
                guard let message = try? incoming.message(from: plist, decodedBytes: &cost, budget: .max) else { return nil }
                return (plist, message)
            }
        }, "\(name): the tree path refused it")
        #expect(tree.grew <= tree.charged + Self.slack, "\(name): the tree and message held \(tree.grew) bytes, charged \(tree.charged)")
        // As the walk builds it directly.
        let direct = try #require(Self.held { cost in
            bytes.withUnsafeBytes { ForwardScan.decode($0, limits: Self.open, decodedBytes: &cost) }
        }, "\(name): the walk refused it")
        #expect(direct.grew <= direct.charged + Self.slack, "\(name): the message held \(direct.grew) bytes, charged \(direct.charged)")
        // The walk builds no dictionary for an item: it is charged less, never more.
        #expect(direct.charged <= tree.charged, "\(name): the walk charged \(direct.charged), the tree path \(tree.charged)")
        // The daemon's scan, which forwards it unread, charges what its reader's walk will.
        let scanned = try #require(bytes.withUnsafeBytes { ForwardScan.scan($0, limits: Self.open) })
        #expect(scanned.decodedBytes == direct.charged, "\(name)")
    }

    /// Shared objects referenced from a plain array: every kind of value a payload can repeat.
    static let values: [(String, [UInt8], [[UInt8]])] = [
        ("a 1-entry dictionary", [0xD1, 2, 3], [[0x51, 0x6B], [0x10, 1]]),
        ("a 2-entry dictionary", [0xD2, 2, 4, 3, 3], [[0x51, 0x6B], [0x10, 1], [0x51, 0x6C]]),
        ("a 7-entry dictionary", [0xD7] + (2..<9).map { UInt8($0) } + Array(repeating: 9, count: 7),
         (0..<7).map { [0x51, 0x61 + UInt8($0)] } + [[0x10, 1]]),
        ("a 1-element array", [0xA1, 2], [[0x10, 1]]),
        ("an empty array", [0xA0], []),
        ("an empty dictionary", [0xD0], []),
        ("a 1-byte data", [0x41, 1], []),
        ("a 16-character string", [0x5F, 0x10, 16] + Array(repeating: 0x61, count: 16), []),
        ("a 6-unit UTF-16 string", [0x66] + Array(repeating: [0x00, 0xE9], count: 6).flatMap { $0 }, []),
        ("an 8-unit UTF-16 string (16 UTF-8 bytes: not inline)", [0x68] + Array(repeating: [0x00, 0xE9], count: 8).flatMap { $0 }, []),
        ("a dictionary with a 20-character key", [0xD1, 2, 3], [[0x5F, 0x10, 20] + Array(repeating: 0x6B, count: 20), [0x10, 1]]),
        ("an integer", [0x10, 1], []),
    ]

    @Test(arguments: 0..<values.count)
    func aValueIsChargedWhatItBuilds(_ index: Int) throws {
        let (name, shared, more) = Self.values[index]
        let bytes = Self.payload(references: 50_000, to: shared, more: more, message: false)
        let tree = try #require(Self.held { cost in
            bytes.withUnsafeBytes { try? BinaryPlistDecoder.decode($0, limits: Self.open, decodedBytes: &cost) }
        }, "\(name): refused")
        #expect(tree.grew <= tree.charged + Self.slack, "\(name): held \(tree.grew) bytes, charged \(tree.charged)")
    }

    /// The attack itself, at the default limits: 3.9 M references to one empty dictionary as a `complete`'s
    /// items (a 3.9 MB frame). Each path a receiver may take refuses it; before, each took it.
    @Test func manyReferencesToOneItemAreRefused() {
        let bytes = Self.payload(references: 3_900_000, to: [0xD0], message: true)
        bytes.withUnsafeBytes { payload in
            var cost = 0
            #expect(ForwardScan.scan(payload, limits: .default) == nil)
            #expect(ForwardScan.decode(payload, limits: .default, decodedBytes: &cost) == nil)
            var incoming = IncomingDescriptors()
            let read = Result { () throws -> Message in
                let plist = try BinaryPlistDecoder.decode(payload, limits: .default, decodedBytes: &cost)
                return try incoming.message(from: plist, decodedBytes: &cost,
                                            budget: WireLimits.default.decodedBytesBudget(payloadBytes: payload.count))
            }
            #expect(throws: (any Error).self) { try read.get() }
        }
    }
}
