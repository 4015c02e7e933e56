// `sdk-host bench codec`, also part of every full run: the wire codec's figures per call, for the typical
// 306-byte `begin`, beside Foundation's PropertyListSerialization on the same bytes (timed in the
// foundation-codec-bench helper, so that sdk-host itself never links Foundation).
import SDKHost
import SDKPosix
import SDKWire

#if canImport(Glibc)
import Glibc
#endif

enum CodecBench {
    struct Result {
        var bytes = 0
        var encode = 0.0, decode = 0.0, foundationEncode = Double.nan, foundationDecode = Double.nan
        /// An `assigned` (one per daemon request) through the decoder into a `Message`, and read as a flat frame.
        var assignedDecode = 0.0, assignedFlat = 0.0
        /// A `begin` from its items to frame bytes, as the host writes one per request (message built, then encoded).
        var beginFrame = 0.0
        /// That `begin`'s payload to a `Message`, as a worker reads one (`ForwardScan.decode`), and through the
        /// decoder's `PlistValue` tree and `Message(plist:)`, as every receiver did before.
        var beginMessage = 0.0, beginMessageTree = 0.0
    }

    static func measure(quick: Bool) -> Result {
        let message = SampleMessages.begin
        var encoder = BinaryPlistEncoder()
        var buffer: [UInt8] = []
        let payload = BinaryPlistEncoder.encode(message)
        let n = quick ? 5_000 : 20_000
        var r = Result(bytes: payload.count)
        r.encode = medianMicrosecondsPerCall(n) {
            buffer.removeAll(keepingCapacity: true)
            encoder.encode(message, appendingTo: &buffer)
        }
        r.decode = medianMicrosecondsPerCall(n) { blackHole(try! BinaryPlistDecoder.decode(payload)) }
        var assigned: [UInt8] = []
        _ = FlatFrame.appendPayload(Message.assigned(id: RequestID(), pid: 4242).flatFields!, to: &assigned)
        r.assignedDecode = medianMicrosecondsPerCall(n) { blackHole(try! Message(plist: BinaryPlistDecoder.decode(assigned))) }
        r.assignedFlat = medianMicrosecondsPerCall(n) { blackHole(assigned.withUnsafeBytes { FlatFrame.message(from: $0) }!) }
        let begin = Message.begin(id: RequestID(), items: [EmbeddedBench.item], extensionID: nil, deadlineMs: 30_000)
        var outgoing = OutgoingDescriptors()
        r.beginFrame = medianMicrosecondsPerCall(n) {
            buffer.removeAll(keepingCapacity: true)
            try! outgoing.encode(begin, with: &encoder, appendingTo: &buffer)
        }
        let beginPayload = Array(buffer.dropFirst(Frame.headerSize))  // the frame the last timed call wrote
        r.beginMessage = medianMicrosecondsPerCall(n) {
            var charged = 0
            blackHole(beginPayload.withUnsafeBytes { ForwardScan.decode($0, limits: .default, decodedBytes: &charged) }!)
        }
        r.beginMessageTree = medianMicrosecondsPerCall(n) { blackHole(try! Message(plist: BinaryPlistDecoder.decode(beginPayload))) }
        (r.foundationEncode, r.foundationDecode) = foundation(payload, iterations: n / 10)
        return r
    }

    /// Foundation's figures for the same bytes, from the foundation-codec-bench helper next to this binary.
    static func foundation(_ payload: [UInt8], iterations: Int) -> (Double, Double) {
        guard let dir = currentExecutableDirectory(), access("\(dir)/foundation-codec-bench", X_OK) == 0,
            let helper = try? spawnWithChannels(SpawnRequest(
                path: "\(dir)/foundation-codec-bench", arguments: ["foundation-codec-bench", String(iterations)], environment: []))
        else { return (.nan, .nan) }
        // Spawned children get /dev/null on stdin; the payload goes over their fd 3 channel, then EOF.
        _ = payload.withUnsafeBytes { try? sendAll(helper.socket.rawValue, $0) }
        shutdown(helper.socket.rawValue, Int32(SHUT_WR))
        var output: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 256)
        _ = fcntl(helper.stdout.rawValue, F_SETFL, 0)
        while true {
            let got = read(helper.stdout.rawValue, &chunk, chunk.count)
            if got <= 0 { break }
            output += chunk[0..<got]
        }
        helper.terminate(signal: 0)  // it has finished; signal 0 only checks, then it is reaped
        let fields = String(decoding: output, as: UTF8.self).split(separator: " ").compactMap { Double($0.trimmingSpace) }
        return fields.count == 2 ? (fields[0], fields[1]) : (.nan, .nan)
    }

    @inline(never) static func blackHole<T>(_ value: T) { withExtendedLifetime(value) {} }
}

extension Substring {
    var trimmingSpace: String { String(self.filter { !$0.isWhitespace }) }
}
