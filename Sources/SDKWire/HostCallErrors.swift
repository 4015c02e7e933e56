// The errors a host call can end with (Messages.swift, "Host services"), declared once for every side: the host
// and the daemon (domain "SDKHost"), the worker runtime (domain "SDKExtension") and the test harness that fakes
// the app's services. docs/EXTENSIONS.md lists the codes.

extension ExtensionError {
    // MARK: From the host ("SDKHost")

    /// A call to a service the extension's manifest does not list under `HostServices`.
    package static func serviceNotAllowed(_ name: String) -> ExtensionError {
        ExtensionError(domain: "SDKHost", code: 10, message: "service '\(name)' is not in this extension's HostServices")
    }

    /// A call to a service the app did not register.
    package static func serviceNotProvided(_ name: String) -> ExtensionError {
        ExtensionError(domain: "SDKHost", code: 11, message: "the app provides no service '\(name)'")
    }

    /// A call made while its request was ending on the host (cancelled, timed out).
    package static let hostCallRequestEnded = ExtensionError(domain: "SDKHost", code: 12, message: "the request has ended")

    /// The app's handler threw an error that is not an `ExtensionError`.
    package static func serviceFailed(_ name: String, _ error: any Error) -> ExtensionError {
        ExtensionError(domain: "SDKHost", code: 13, message: "service '\(name)' failed: \(error)")
    }

    /// What the extension gets when service `name`'s handler throws `error`: an `ExtensionError` as it is, any
    /// other as `serviceFailed`.
    package static func thrown(by name: String, _ error: any Error) -> ExtensionError {
        (error as? ExtensionError) ?? .serviceFailed(name, error)
    }

    /// Through the daemon: the app that owns the request has gone.
    package static let appGone = ExtensionError(domain: "SDKHost", code: 14, message: "the app that made the request has gone")

    /// The app's answer could not be sent to the worker (too large for a frame).
    package static func answerNotSent(_ why: String) -> ExtensionError {
        ExtensionError(domain: "SDKHost", code: 15, message: "the service's answer cannot be sent: \(why)")
    }

    /// Through the daemon: the call could not be sent on to the app (too large for the client's frames).
    package static func callNotForwarded(_ why: String) -> ExtensionError {
        ExtensionError(domain: "SDKHost", code: 16, message: "the call cannot be sent to the app: \(why)")
    }

    // MARK: From the worker runtime ("SDKExtension")

    /// A call past MaxHostCallsInFlight.
    package static func tooManyHostCalls(_ limit: Int) -> ExtensionError {
        ExtensionError(domain: "SDKExtension", code: 4, message: "more than \(limit) host calls in flight (MaxHostCallsInFlight)")
    }

    /// A call made after its request finished (or one the request's end cut short).
    package static let requestEnded = ExtensionError(domain: "SDKExtension", code: 5, message: "the request has ended")

    /// A context made without a host (no caller): no service can answer.
    package static let noHost = ExtensionError(domain: "SDKExtension", code: 6, message: "no host to call")

    /// A call that could not be sent (too large for a frame: see the worker's log).
    package static let callNotSent = ExtensionError(domain: "SDKExtension", code: 7, message: "the call cannot be sent (too large for a frame)")
}
