// SDKHost: the app-facing client library (shared/DESIGN.md "Host API"): Host, Extension, and the values
// their callbacks carry. This file holds those values: why a request was interrupted, the errors `perform`
// throws, host errors, crash reports and log levels.
import SDKWire

#if canImport(Glibc)
import Glibc
#endif
import SDKPosix

/// Why a request was interrupted: its worker died or misbehaved, or the host went away.
public enum InterruptionReason: Sendable, Equatable, CustomStringConvertible {
    /// The worker was killed by this signal (it crashed, or something outside sdk-host killed it).
    case signal(Int32)
    /// The worker exited with this status while the request was in flight.
    case exited(Int32)
    /// The worker stopped answering heartbeats, or ignored a cancel past the grace period and was killed.
    case hang
    /// The worker broke the protocol (garbage, an oversized frame, a reply to an unknown request); `detail` says how.
    case protocolViolation(String)
    /// The connection to the daemon was lost.
    case disconnected
    /// The worker could not be started; `detail` names the executable and the error.
    case launchFailed(String)
    /// The host shut down with the request in flight, or the request was begun while it was stopping.
    case hostShutdown
    /// The request passed its deadline. It ended at once; a worker running it was told to cancel it (and killed
    /// only if it ignored the cancel past the grace period).
    case timedOut
    /// Too many requests were waiting for this extension's workers (`MaxQueuedRequests`), or this client had
    /// too many in flight (`MaxInFlightRequests`): the request ended at once and touched no worker.
    case overloaded
    /// The extension's workers kept dying on their own (`RestartLimitBurst` times within
    /// `RestartLimitIntervalSeconds`), so it is quarantined: the request ended at once and spawned nothing.
    case quarantined

    /// The short name used on the wire, in `status` and in statistics: signal, exit, hang, protocol,
    /// disconnected, launch, shutdown, timedOut, overloaded or quarantined.
    public var kind: String {
        switch self {
        case .signal: "signal"
        case .exited: "exit"
        case .hang: "hang"
        case .protocolViolation: "protocol"
        case .disconnected: "disconnected"
        case .launchFailed: "launch"
        case .hostShutdown: "shutdown"
        case .timedOut: "timedOut"
        case .overloaded: "overloaded"
        case .quarantined: "quarantined"
        }
    }

    public var description: String {
        switch self {
        case .signal(let s): "signal \(s) (\(signalName(s)))"
        case .exited(let code): "exit \(code)"
        case .hang: "hang"
        case .protocolViolation(let detail): "protocol: \(detail)"
        case .disconnected: "disconnected"
        case .launchFailed(let detail): "launch failed: \(detail)"
        case .hostShutdown: "host shut down"
        case .timedOut: "timed out"
        case .overloaded: "overloaded"
        case .quarantined: "quarantined"
        }
    }
}

/// How a request ended. Exactly one per request.
public enum RequestOutcome: Sendable, Equatable {
    /// The extension completed it.
    case completed([ExtensionItem])
    /// The host or the extension cancelled it.
    case cancelled(ExtensionError)
    /// It was interrupted.
    case interrupted(InterruptionReason)
}

/// What `Extension.perform` throws when a request does not complete. Task cancellation throws
/// `CancellationError` instead.
public enum RequestFailure: Error, Sendable, Equatable, CustomStringConvertible {
    /// The extension (or a host-side `cancelRequest`) cancelled the request.
    case cancelled(ExtensionError)
    /// The request was interrupted.
    case interrupted(InterruptionReason)

    public var description: String {
        switch self {
        case .cancelled(let e): "cancelled: \(e)"
        case .interrupted(let r): "interrupted: \(r)"
        }
    }
}

/// A host-level error: an unknown extension, a bad manifest or configuration, a host that cannot start.
public struct HostError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What kind of failure.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Raw: String, Hashable, Sendable {
            case unknownExtension, invalidManifest, executableNotFound, invalidConfiguration, system, daemonUnavailable
            case refused
        }
        private let raw: Raw
        private init(_ raw: Raw) { self.raw = raw }
        /// The code whose `description` is `name` (a daemon's `connected` names them), or nil.
        package init?(name: some StringProtocol) {
            guard let raw = Raw(rawValue: String(name)) else { return nil }
            self.raw = raw
        }
        /// No extension has this identifier.
        public static let unknownExtension = Code(.unknownExtension)
        /// A manifest (Info.plist) is missing keys, has ill-typed or unknown keys, or is not a plist.
        public static let invalidManifest = Code(.invalidManifest)
        /// The manifest names an executable that is not in any executable search path.
        public static let executableNotFound = Code(.executableNotFound)
        /// The extension is installed but refused: its manifest, folder or executable is owned by another user or
        /// writable by others, or its policy asks for more than the operator's ceilings allow.
        public static let refused = Code(.refused)
        /// The host configuration is invalid.
        public static let invalidConfiguration = Code(.invalidConfiguration)
        /// A system call failed (creating the event loop, say).
        public static let system = Code(.system)
        /// The daemon cannot be reached, or refused this client.
        public static let daemonUnavailable = Code(.daemonUnavailable)
        public var description: String { raw.rawValue }
    }

    /// What kind of failure.
    public let code: Code
    /// What failed and where: the identifier, file and key.
    public let detail: String

    /// Creates an error.
    public init(_ code: Code, _ detail: String) {
        self.code = code
        self.detail = detail
    }

    public var description: String { detail }
}

/// What the host recorded about a worker that died other than by being retired.
public struct CrashReport: Sendable, Equatable {
    /// The extension's identifier.
    public var extensionIdentifier: String
    /// The worker's pid.
    public var pid: Int32
    /// How it ended, or why the host killed it.
    public var reason: InterruptionReason
    /// Seconds since the Unix epoch.
    public var time: Double
    /// Requests that were in flight on it.
    public var inFlightRequests: [RequestID]
    /// The last bytes (up to 64 KiB) the worker wrote to stderr.
    public var stderrTail: String

    /// The line that says why the worker died: the Swift runtime's `Fatal error: …` (an out-of-range index, a
    /// failed `precondition`, `fatalError`), else the backtracer's "crashed" line, else the last line of the
    /// stderr tail; nil when the worker wrote nothing.
    public var fatalErrorLine: String?
    /// The daemon's app ("uid/name") whose workers these were; nil for a shared pool or an embedded host. A
    /// daemon shows a report only to that uid (and root).
    public var app: String?

    /// Creates a report; `fatalErrorLine` is found in `stderrTail` unless given.
    public init(extensionIdentifier: String, pid: Int32, reason: InterruptionReason, time: Double,
                inFlightRequests: [RequestID], stderrTail: String, fatalErrorLine: String? = nil)
    {
        self.extensionIdentifier = extensionIdentifier
        self.pid = pid
        self.reason = reason
        self.time = time
        self.inFlightRequests = inFlightRequests
        self.stderrTail = stderrTail
        self.fatalErrorLine = fatalErrorLine ?? Self.fatalErrorLine(in: stderrTail)
    }

    static func fatalErrorLine(in stderrTail: String) -> String? {
        let lines = stderrTail.split(separator: "\n", omittingEmptySubsequences: true)
        if let fatal = lines.first(where: { $0.contains("Fatal error:") || $0.contains("fatal error:") }) {
            return String(fatal.drop { $0 == " " })
        }
        if let crashed = lines.first(where: { $0.contains("crashed:") }) { return String(crashed) }
        return lines.last.map(String.init)
    }
}

/// Log severity, lowest first.
public enum LogLevel: Int, Sendable, Comparable, CaseIterable, CustomStringConvertible {
    /// Per-request detail: acknowledged cancellations, cancels of requests that had ended, client connections.
    case debug
    /// Worker starts and exits, extension output, daemon lifecycle.
    case info
    /// Crashes, hangs, dropped late replies, refused clients.
    case warning
    /// Protocol violations and failures to launch.
    case error
    public static func < (a: LogLevel, b: LogLevel) -> Bool { a.rawValue < b.rawValue }
    public var description: String { ["debug", "info", "warning", "error"][rawValue] }
    /// Parses "debug", "info", "warning" or "error".
    public init?(name: String) {
        guard let level = LogLevel.allCases.first(where: { $0.description == name }) else { return nil }
        self = level
    }
}
