// `sdk-host bench calls` (and the full bench): a host call's round trip beside a request's. The Renderer renders
// a document with no parts (a request alone) and one with 8 parts (the request and 8 calls to the app's
// `document.part`, one after another), alternately; each pair's difference over 8 is one call's cost. Paired and
// alternated, so that a drift of the machine's speed moves both alike. Embedded, and through a daemon.
import Dispatch
import SDKHost

enum HostCallBench {
    struct Result {
        /// The Renderer's request with no calls (µs).
        var request = Samples()
        /// One host call, from the extension's callHost to its answer (µs).
        var call = Samples()
    }

    static let calls = 8

    static func measure(_ host: ExtensionHost, pairs: Int) -> Result {
        let renderer: Extension
        do {
            renderer = try host.extension(identifier: "com.example.renderer")
            try renderer.registerService("document.part") { _ in [ExtensionItem(text: "p")] }
        } catch {
            fail("bench: \(error)")
        }
        let done = DispatchSemaphore(value: 0)
        renderer.requestCompletionHandler = { _, _ in done.signal() }
        renderer.requestCancellationHandler = { _, error in fail("bench: renderer cancelled: \(error)") }
        renderer.requestInterruptionHandler = { _, reason in fail("bench: renderer interrupted: \(reason)") }
        let plain = [ExtensionItem(text: "no parts")]
        let withCalls = [ExtensionItem(text: String(repeating: "{{p}}", count: calls))]
        func time(_ items: [ExtensionItem]) -> Double {
            let start = nowMicros()
            renderer.beginRequest(withInputItems: items)
            done.wait()
            return nowMicros() - start
        }
        var result = Result()
        for i in 0..<(pairs + pairs / 10) {
            let alone = time(plain)
            let called = time(withCalls)
            guard i >= pairs / 10 else { continue }  // warm-up
            result.request.add(alone)
            result.call.add((called - alone) / Double(calls))
        }
        return result
    }
}
