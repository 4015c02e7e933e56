// `sdk-host demo`: the first thing a newcomer runs. Until the embedded host lands (issue 3) it shows the one
// layer that exists, the wire codec, on a real request message, and says so.
import SDKWire

enum DemoCommand {
    static func run(_ arguments: [String]) {
        let message = SampleMessages.begin
        let payload = BinaryPlistEncoder.encode(message)
        print("sdk-host demo: only the wire codec exists so far; the embedded host and workers come next.")
        print("A 'begin' request message encodes to \(payload.count) bytes of bplist00:")
        print("  " + message.description)
        do {
            let back = try BinaryPlistDecoder.decode(payload)
            print("Decoded back: \(back == message ? "identical" : "DIFFERENT")")
        } catch {
            fail("demo: decoding our own message failed: \(error)")
        }
    }
}
