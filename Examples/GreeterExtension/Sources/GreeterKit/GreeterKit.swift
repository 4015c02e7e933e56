// Greeter's handler and helpers. The greeting comes from the GREETING environment variable, which the
// manifest sets with the `Environment` key.
import SDKExtension

#if canImport(Glibc)
import Glibc
#endif

/// Formats greetings; tells its delegate about each one.
public final class GreetingFormatter: @unchecked Sendable {
    public let greeting: String
    /// Weak, as a delegate should be: the delegate usually owns the formatter.
    public weak var delegate: GreetingDelegate?

    public init(greeting: String) { self.greeting = greeting }

    public func greet(_ name: String) -> String {
        delegate?.didGreet(name)
        return "\(greeting), \(name)!"
    }
}

/// Counts greetings; owns a formatter and is its delegate.
public final class GreetingDelegate: @unchecked Sendable {
    public let formatter: GreetingFormatter
    public private(set) var count = 0

    public init(greeting: String) {
        formatter = GreetingFormatter(greeting: greeting)
        formatter.delegate = self
    }

    func didGreet(_ name: String) { count += 1 }
}

/// The same pair written with a strong delegate: a retain cycle, which the package's tests catch.
public final class CyclicGreeter: @unchecked Sendable {
    public var partner: CyclicGreeter?
    public init() {}
    public static func pair() -> CyclicGreeter {
        let a = CyclicGreeter(), b = CyclicGreeter()
        a.partner = b
        b.partner = a
        return a
    }
}

public struct GreeterHandler: RequestHandler {
    let greeting = getenv("GREETING").map { String(cString: $0) } ?? "Hello"

    public init() {}

    public func beginRequest(with context: ExtensionContext) {
        // "count:N" streams "1", "2", … N, one every 100 ms, then completes; a host cancel ends it at the next step.
        if let spec = context.inputItems.first?.title, spec.hasPrefix("count:"), let n = Int(spec.dropFirst(6)) {
            for i in 1...max(1, min(n, 1000)) {
                usleep(100_000)
                if !context.send([ExtensionItem(title: "\(i)")]) { break }
            }
            if context.isCancelled {
                context.cancelRequest(withError: .cancelledByHost)
            } else {
                context.completeRequest(returningItems: [ExtensionItem(title: "counted \(n)")])
            }
            return
        }
        let helper = GreetingDelegate(greeting: greeting)
        // "nick:NAME" greets NAME by the nickname the app knows for it: asked with the host service `nickname`
        // (the manifest's HostServices), the blocking form of callHost from this handler's own thread.
        if let spec = context.inputItems.first?.title, spec.hasPrefix("nick:") {
            do {
                let answer = try context.callHost("nickname", [ExtensionItem(title: String(spec.dropFirst(5)))])
                context.completeRequest(returningItems: [ExtensionItem(title: helper.formatter.greet(answer.first?.title ?? "stranger"))])
            } catch let error as ExtensionError {
                context.cancelRequest(withError: error)
            } catch {
                context.cancelRequest(withError: .cancelledByHost)
            }
            return
        }
        let replies = context.inputItems.map { ExtensionItem(title: helper.formatter.greet($0.title ?? "stranger")) }
        context.completeRequest(returningItems: replies)
    }
}
