// Host services from the app's side: the app registers an async handler on an `Extension` under a name; a worker
// running one of that Extension's requests calls it with `context.callHost(name, items)` (the extension's manifest
// must list the name under `HostServices`). The engine (HostEngine+HostCalls) checks the call and starts the
// handler in a Task of its own; when the request ends, however it ends, the Tasks of its calls still running are
// cancelled and their results dropped. Through the daemon, the call travels to the client that owns the request
// and runs there (DaemonClient); the daemon never runs app code.
import SDKWire
import Synchronization
import Dispatch

/// One call from an extension to a service the app provides.
public struct HostServiceCall: Sendable {
    /// The service's name, as registered.
    public let service: String
    /// The request whose handler made the call.
    public let requestID: RequestID
    /// What the extension sent (files included: they are the handler's to read, and closed when released).
    public let items: [ExtensionItem]

    public init(service: String, requestID: RequestID, items: [ExtensionItem]) {
        self.service = service
        self.requestID = requestID
        self.items = items
    }
}

/// A service's handler: returns the items the extension gets back, or throws (an `ExtensionError` reaches the
/// extension as it is; any other error as domain "SDKHost", code 13, with its description). Runs in a Task of its
/// own, which is cancelled when the calling request ends or the extension gives up on the call: check
/// `Task.isCancelled` in long work. A `@MainActor` closure is fine: the Task hops to the main actor.
public typealias HostServiceHandler = @Sendable (HostServiceCall) async throws -> [ExtensionItem]

/// Where the engine sends a request's host calls: an Extension's services (embedded, or in the app of a daemon
/// client), or the daemon's link to the client that owns the request.
package protocol HostServiceProvider: Sendable {
    /// Starts `call`; `done` runs at most once, on any thread. Returns what cancels the call: after it, `done` may
    /// still run, and its result is the caller's to drop.
    func start(_ call: HostServiceCall, done: @escaping @Sendable (Result<[ExtensionItem], ExtensionError>) -> Void)
        -> @Sendable () -> Void
}

/// The services one `Extension` provides, by name.
package final class HostServiceTable: HostServiceProvider {
    private let handlers = Mutex<[String: HostServiceHandler]>([:])

    package init() {}

    func set(_ name: String, _ handler: HostServiceHandler?) { handlers.withLock { $0[name] = handler } }

    package var names: [String] { handlers.withLock { $0.keys.sorted() } }

    package func start(_ call: HostServiceCall, done: @escaping @Sendable (Result<[ExtensionItem], ExtensionError>) -> Void)
        -> @Sendable () -> Void
    {
        guard let handler = handlers.withLock({ $0[call.service] }) else {
            done(.failure(.serviceNotProvided(call.service)))
            return {}
        }
        let task = Task.detached {
            do {
                done(.success(try await handler(call)))
            } catch {
                done(.failure(.thrown(by: call.service, error)))
            }
        }
        // Cancelled from the engine's loop (or the client's): the Task's cancellation handlers are the app's code,
        // and run inside `cancel()`, so it is called from elsewhere.
        return { DispatchQueue.global().async { task.cancel() } }
    }
}

extension Extension {
    /// Provides the service `name` to this extension's requests begun through this `Extension` (and its
    /// `perform`, `start` and streams): a worker running one of them calls it with `context.callHost(name, items)`,
    /// if its manifest lists `name` under `HostServices`. Registering a name again replaces its handler for calls
    /// made from then on.
    ///
    /// - Parameters:
    ///   - name: 1 to 128 letters, digits, '.', '-' and '_'.
    ///   - handler: Runs in a Task of its own for each call; see `HostServiceHandler`.
    /// - Throws: `HostError.Code.invalidConfiguration` for a name that is not a service name.
    public func registerService(_ name: String, _ handler: @escaping HostServiceHandler) throws(HostError) {
        guard ExtensionPolicy.isServiceName(name) else {
            throw HostError(.invalidConfiguration, "'\(name)' is not a service name (1 to 128 letters, digits, '.', '-' and '_')")
        }
        services.set(name, handler)
    }

    /// Stops providing `name`: calls made from then on end with an error; calls running go on.
    public func removeService(_ name: String) {
        services.set(name, nil)
    }
}
