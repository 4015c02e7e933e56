// Greeter (com.example.greeter): "Hello, <name>!" for each input item's title. The greeting comes from the
// GREETING environment variable, which the manifest sets with the `Environment` key.
import SDKExtension

#if canImport(Glibc)
import Glibc
#endif

@main
struct Greeter: RequestHandler {
    let greeting = getenv("GREETING").map { String(cString: $0) } ?? "Hello"

    func beginRequest(with context: ExtensionContext) {
        let replies = context.inputItems.map { ExtensionItem(title: "\(greeting), \($0.title ?? "stranger")!") }
        context.completeRequest(returningItems: replies)
    }
}
