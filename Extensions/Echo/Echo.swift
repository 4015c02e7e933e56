// Echo (com.example.echo): returns its input items unchanged. The smallest useful extension, and the one the
// benchmarks use for round trips.
import SDKExtension

@main
struct Echo: RequestHandler {
    /// Echoing never blocks, so it runs on the runtime's reader thread (no thread hand-off per request).
    static var runsInline: Bool { true }

    func beginRequest(with context: ExtensionContext) {
        context.completeRequest(returningItems: context.inputItems)
    }
}
