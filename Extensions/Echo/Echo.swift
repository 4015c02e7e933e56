// Echo (com.example.echo): returns its input items unchanged. The smallest useful extension, and the one the
// benchmarks use for round trips.
import SDKExtension

@main
struct Echo: RequestHandler {
    func beginRequest(with context: ExtensionContext) {
        context.completeRequest(returningItems: context.inputItems)
    }
}
