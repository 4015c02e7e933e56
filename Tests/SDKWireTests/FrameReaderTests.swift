// Framing: chunked delivery (down to one byte at a time), several frames per chunk, and the frame limit.
import Testing
import HostTestSupport
import SDKWire

@Suite struct FrameReaderTests {
    static let messages: [PlistValue] = [
        ["type": "ping"], ["type": "begin", "id": "A", "items": [["title": "t"]]], .data(Array(repeating: 1, count: 5000)),
    ]

    static var stream: [UInt8] {
        messages.flatMap { try! Frame.encode($0) }
    }

    func readAll(chunkSizes: (Int) -> Int) throws -> [PlistValue] {
        var reader = FrameReader()
        var out: [PlistValue] = []
        let bytes = Self.stream
        var i = 0
        var n = 0
        while i < bytes.count {
            let size = min(chunkSizes(n), bytes.count - i)
            reader.append(contentsOf: bytes[i..<i + size])
            i += size
            n += 1
            while let value = try reader.nextValue() { out.append(value) }
        }
        #expect(reader.bufferedByteCount == 0)
        return out
    }

    @Test func oneByteAtATime() throws {
        #expect(try readAll { _ in 1 } == Self.messages)
    }

    @Test func wholeStreamAtOnce() throws {
        #expect(try readAll { _ in 1 << 20 } == Self.messages)
    }

    @Test func randomChunks() throws {
        var g = SeededGenerator(seed: testSeed(default: 7))
        for _ in 0..<50 {
            #expect(try readAll { _ in Int.random(in: 1...700, using: &g) } == Self.messages)
        }
    }

    @Test func headerIsBigEndianLength() throws {
        let frame = try Frame.encode(["type": "ping"])
        let length = Int(frame[0]) << 24 | Int(frame[1]) << 16 | Int(frame[2]) << 8 | Int(frame[3])
        #expect(length == frame.count - 4)
    }

    @Test func oversizedDeclaredLengthIsRejectedBeforeBuffering() {
        var reader = FrameReader(limits: WireLimits(maxFrameBytes: 1024))
        reader.append(contentsOf: [0x7F, 0xFF, 0xFF, 0xFF])  // claims 2 GiB
        #expect(throws: WireError.self) { try reader.nextValue() }
        do {
            _ = try reader.nextValue()
        } catch {
            #expect(error.code == .frameTooLarge)
        }
        #expect(reader.bufferedByteCount == 4, "no bytes beyond those received")
        // The stream cannot be resynchronised, so later frames keep failing.
        reader.append(contentsOf: try! Frame.encode("ok"))
        #expect(throws: WireError.self) { try reader.nextValue() }
    }

    @Test func frameAtExactlyTheLimitIsAccepted() throws {
        let payload = BinaryPlistEncoder.encode(.data(Array(repeating: 0, count: 100)))
        var reader = FrameReader(limits: WireLimits(maxFrameBytes: payload.count))
        reader.append(contentsOf: try Frame.encode(.data(Array(repeating: 0, count: 100))))
        #expect(try reader.nextValue() == .data(Array(repeating: 0, count: 100)))
    }

    @Test func encodingOverTheLimitThrowsAndLeavesBufferIntact() {
        var encoder = BinaryPlistEncoder()
        var out: [UInt8] = [1, 2, 3]
        #expect(throws: WireError.self) {
            try Frame.encode(.data(Array(repeating: 0, count: 2000)), with: &encoder, appendingTo: &out, limits: WireLimits(maxFrameBytes: 1000))
        }
        #expect(out == [1, 2, 3])
    }

    /// The encoder's own check: a payload of exactly the limit is written, one byte over is refused.
    @Test func aPayloadOfExactlyTheLimitIsEncodedAndOneByteMoreIsNot() throws {
        let value = PlistValue.data(Array(repeating: 5, count: 3000))
        let size = BinaryPlistEncoder.encode(value).count
        var encoder = BinaryPlistEncoder()
        var out: [UInt8] = []
        try Frame.encode(value, with: &encoder, appendingTo: &out, limits: WireLimits(maxFrameBytes: size))
        #expect(out.count == size + Frame.headerSize)
        var refused: [UInt8] = [9]
        #expect(throws: WireError.self) {
            try Frame.encode(value, with: &encoder, appendingTo: &refused, limits: WireLimits(maxFrameBytes: size - 1))
        }
        #expect(refused == [9])
    }

    /// A payload over the limit is refused from its size alone: nothing is copied, and the buffer does not grow
    /// (a 200 MiB reply was copied twice before its refusal, and its worker missed heartbeats under load).
    @Test func aPayloadOverTheLimitIsRefusedBeforeItIsCopied() throws {
        let big = ExtensionItem(attachments: [.data([UInt8](repeating: 7, count: 64 << 20))])
        var encoder = BinaryPlistEncoder()
        for message in [Message.complete(id: RequestID(high: 1, low: 2), items: [big])] {
            var out: [UInt8] = [1, 2, 3]
            var outgoing = OutgoingDescriptors()
            do {
                try outgoing.encode(message, with: &encoder, appendingTo: &out)
                Issue.record("a 64 MiB reply was encoded")
            } catch {
                #expect(error.detail.contains("exceeds the limit of 16777216"), "\(error)")
            }
            #expect(out == [1, 2, 3] && out.capacity < 1024, "grew to \(out.capacity)")
            do {
                try Frame.encode(message.plist, with: &encoder, appendingTo: &out)
                Issue.record("a 64 MiB plist was encoded")
            } catch {
                #expect(error.detail.contains("exceeds the limit of 16777216"), "\(error)")
            }
            #expect(out == [1, 2, 3] && out.capacity < 1024, "grew to \(out.capacity)")
        }
    }

    @Test func undecodablePayloadIsConsumedAndTheNextFrameStillReads() throws {
        var reader = FrameReader()
        reader.append(contentsOf: [0, 0, 0, 3, 0x41, 0x42, 0x43])  // framed, but not a bplist
        reader.append(contentsOf: try Frame.encode("next"))
        #expect(throws: WireError.self) { try reader.nextValue() }
        #expect(try reader.nextValue() == "next")
    }
}
