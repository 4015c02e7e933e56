// Hoarder (com.example.hoarder): completes each request but keeps its context in a global array, as an SDK
// that caches what it should not. The worker runtime reports each one as a leak.
import SDKExtension
import Synchronization

let kept = Mutex<[ExtensionContext]>([])

@main
struct Hoarder: RequestHandler {
    func beginRequest(with context: ExtensionContext) {
        kept.withLock { $0.append(context) }
        context.completeRequest(returningItems: context.inputItems)
    }
}
