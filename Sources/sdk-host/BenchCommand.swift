// `sdk-host bench codec`: encode/decode cost of a typical message next to Foundation's
// PropertyListSerialization in the same run. Meaningful only in a release build.
import Foundation
import SDKWire
import SDKWireFoundation

enum BenchCommand {
    static func run(_ arguments: [String]) {
        guard arguments.first == "codec" else { fail("usage: sdk-host bench codec [--json]", status: 2) }
        let json = arguments.contains("--json")
        let r = codec()
        if json {
            print(
                "{\"message_bytes\":\(r.bytes),\"codec_encode_us\":\(fmt(r.encode)),\"codec_decode_us\":\(fmt(r.decode)),"
                    + "\"foundation_encode_us\":\(fmt(r.foundationEncode)),\"foundation_decode_us\":\(fmt(r.foundationDecode))}")
        } else {
            print("codec, \(r.bytes)-byte begin message (median of 7 runs)")
            print("            ours µs   Foundation µs   ratio")
            print("  encode  \(pad(fmt(r.encode), 9))  \(pad(fmt(r.foundationEncode), 14))   \(fmt(r.encode / r.foundationEncode))")
            print("  decode  \(pad(fmt(r.decode), 9))  \(pad(fmt(r.foundationDecode), 14))   \(fmt(r.decode / r.foundationDecode))")
        }
    }

    struct CodecResult {
        var bytes = 0
        var encode = 0.0, decode = 0.0, foundationEncode = 0.0, foundationDecode = 0.0
    }

    static func codec() -> CodecResult {
        let message = SampleMessages.begin
        var encoder = BinaryPlistEncoder()
        var buffer: [UInt8] = []
        let payload = BinaryPlistEncoder.encode(message)
        let foundationObject = PlistFoundation.foundationObject(message)
        let foundationPayload = try! PropertyListSerialization.data(
            fromPropertyList: foundationObject, format: .binary, options: 0)
        var r = CodecResult(bytes: payload.count)
        r.encode = perCall(20_000) {
            buffer.removeAll(keepingCapacity: true)
            encoder.encode(message, appendingTo: &buffer)
        }
        r.decode = perCall(20_000) {
            blackHole(try! BinaryPlistDecoder.decode(payload))
        }
        r.foundationEncode = perCall(2_000) {
            blackHole(try! PropertyListSerialization.data(fromPropertyList: foundationObject, format: .binary, options: 0))
        }
        r.foundationDecode = perCall(2_000) {
            blackHole(try! PropertyListSerialization.propertyList(from: foundationPayload, options: [], format: nil))
        }
        return r
    }

    /// Median over 7 runs of the mean time per call, in µs.
    static func perCall(_ iterations: Int, _ body: () -> Void) -> Double {
        for _ in 0..<(iterations / 10) { body() }
        var samples: [Double] = []
        for _ in 0..<7 {
            let start = ContinuousClock.now
            for _ in 0..<iterations { body() }
            let elapsed = ContinuousClock.now - start
            let (s, atto) = elapsed.components
            samples.append((Double(s) * 1e6 + Double(atto) / 1e12) / Double(iterations))
        }
        return samples.sorted()[samples.count / 2]
    }

    @inline(never) static func blackHole<T>(_ value: T) { withExtendedLifetime(value) {} }
    static func fmt(_ v: Double) -> String { String(format: "%.2f", v) }
    static func pad(_ s: String, _ width: Int) -> String { String(repeating: " ", count: max(0, width - s.count)) + s }
}
