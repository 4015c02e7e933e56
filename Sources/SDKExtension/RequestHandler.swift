// SDKExtension: the worker-side runtime that extension executables link (shared/DESIGN.md "Extension API").
// An extension declares one type conforming to RequestHandler (sync) or AsyncRequestHandler and marks it
// @main; the runtime owns the socket, handshake, heartbeat, idle exit and exit when the host goes away.
// Extension code never sees a descriptor. This module never imports the host engine.
import SDKWire

/// A type that handles requests synchronously. Mark it `@main`.
///
/// `beginRequest` runs on a runtime thread; it may block, and it may complete the request later from another
/// thread. Each request must end with `completeRequest` or `cancelRequest` on its context.
public protocol RequestHandler: Sendable {
    /// Creates the handler once per worker process.
    init()
    /// Starts work on one request.
    ///
    /// - Parameter context: The request's input items and the means to finish it.
    func beginRequest(with context: ExtensionContext)

    /// True if `beginRequest` returns quickly and never blocks. The runtime then calls it on its own reader
    /// thread, saving a thread hand-off per request; heartbeats and cancels wait while it runs, so a handler that
    /// blocks here looks hung. What an inline handler sends is written after each 8 frames the reader handles (or
    /// at the end of what it read), several replies in one write: so a crash in an inline handler also
    /// interrupts the requests of that batch that had completed but whose replies were not written yet.
    /// Defaults to false.
    static var runsInline: Bool { get }
}

extension RequestHandler {
    public static var runsInline: Bool { false }
}

/// A type that handles requests with async code. Mark it `@main`.
///
/// A host cancellation cancels the request's Task. If the method returns without finishing the request, the
/// runtime finishes it: cancelled-by-host when it was cancelled, otherwise cancelled with an error saying so.
public protocol AsyncRequestHandler: Sendable {
    /// Creates the handler once per worker process.
    init()
    /// Handles one request.
    ///
    /// - Parameter context: The request's input items and the means to finish it.
    func beginRequest(with context: ExtensionContext) async
}

extension RequestHandler {
    /// Runs the worker: the entry point `@main` calls. Never returns.
    public static func main() {
        let handler = Self()
        WorkerRuntime.run({ context in handler.beginRequest(with: context) }, inline: Self.runsInline, async: nil)
    }
}

extension AsyncRequestHandler {
    /// Runs the worker: the entry point `@main` calls. Never returns.
    public static func main() {
        let handler = Self()
        WorkerRuntime.run(nil, inline: false, async: { context in await handler.beginRequest(with: context) })
    }
}
