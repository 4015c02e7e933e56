// Watcher (com.example.watcher): completes each request, then starts an observation Task that never ends and
// holds the request's context. The worker runtime reports it as a leak.
import SDKExtension

@main
struct Watcher: AsyncRequestHandler {
    func beginRequest(with context: ExtensionContext) async {
        context.completeRequest(returningItems: context.inputItems)
        Task {
            while true {
                try? await Task.sleep(for: .seconds(60))
                _ = context.inputItems.count
            }
        }
    }
}
