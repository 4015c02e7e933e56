// What a host shows an app about itself beyond requests: its extensions and their extension points, whether it
// is embedded or a daemon's client, and worker lifecycle events as an AsyncSequence (shared/DESIGN.md "Visible
// from Swift, publicly").
import SDKWire
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// An extension a host serves.
public struct ExtensionInfo: Sendable, Hashable, CustomStringConvertible {
    /// The manifest's `CFBundleIdentifier`.
    public var identifier: String
    /// The manifest's `NSExtensionPointIdentifier`: what kind of extension it is, e.g. "com.example.text-filter".
    public var extensionPointIdentifier: String

    /// Creates a value.
    public init(identifier: String, extensionPointIdentifier: String) {
        self.identifier = identifier
        self.extensionPointIdentifier = extensionPointIdentifier
    }

    public var description: String { "\(identifier) (\(extensionPointIdentifier))" }
}

/// Which host serves an `ExtensionHost`'s requests.
public enum HostMode: Sendable, Equatable, CustomStringConvertible {
    /// The app's own engine spawns and supervises the workers.
    case embedded
    /// An `sdk-host serve` daemon on `socketPath`, process `pid` (of its current connection; 0 before one).
    case daemon(socketPath: String, pid: Int32)

    public var description: String {
        switch self {
        case .embedded: "embedded host (pid \(getpid()))"
        case .daemon(let path, let pid): "daemon at \(path) (pid \(pid))"
        }
    }
}

/// Something that happened to a worker process.
public struct WorkerEvent: Sendable, Equatable, CustomStringConvertible {
    /// What happened.
    public enum Kind: String, Sendable, CaseIterable {
        /// The process was started (`pid` is new).
        case spawned
        /// It completed its handshake and takes requests.
        case ready
        /// It is gone. `reason` says why when it died rather than being retired (idle, recycled, shut down).
        case exited
        /// It reached `MaxRequestsPerWorker` or `MaxWorkerRSSMB`, or the manifests were reloaded: it is retired.
        case recycled
        /// Its pool is quarantined after a crash loop; `pid` is the worker whose death started it.
        case quarantined
    }

    public var kind: Kind
    public var extensionIdentifier: String
    public var pid: Int32
    /// The daemon client app whose pool the worker is in; nil for shared workers and in an embedded host.
    public var app: String?
    /// For `exited`: why it died, or nil for a clean retirement.
    public var reason: InterruptionReason?
    /// More words: the exit status, the recycle reason, the quarantine's length.
    public var detail: String?

    /// Creates an event.
    public init(kind: Kind, extensionIdentifier: String, pid: Int32, app: String? = nil,
                reason: InterruptionReason? = nil, detail: String? = nil)
    {
        self.kind = kind
        self.extensionIdentifier = extensionIdentifier
        self.pid = pid
        self.app = app
        self.reason = reason
        self.detail = detail
    }

    public var description: String {
        "\(extensionIdentifier) pid \(pid) \(kind.rawValue)" + (reason.map { ": \($0)" } ?? "") + (detail.map { " (\($0))" } ?? "")
    }

    /// The wire form between daemon and client (`event`).
    package var plist: PlistValue {
        var d: [String: PlistValue] = ["kind": .string(kind.rawValue), "extension": .string(extensionIdentifier),
                                       "pid": .integer(Int64(pid))]
        if let app { d["app"] = .string(app) }
        if let reason { d["reason"] = reason.plist }
        if let detail { d["detail"] = .string(detail) }
        return .dictionary(d)
    }

    /// Reads the wire form; nil for an unknown kind or missing fields.
    package init?(plist: PlistValue) {
        guard let kind = plist["kind"]?.stringValue.flatMap(Kind.init(rawValue:)),
            let ext = plist["extension"]?.stringValue, let pid = plist["pid"]?.integerValue
        else { return nil }
        self.init(kind: kind, extensionIdentifier: ext, pid: Int32(truncatingIfNeeded: pid),
                  app: plist["app"]?.stringValue, reason: plist["reason"].map(InterruptionReason.init(plist:)),
                  detail: plist["detail"]?.stringValue)
    }
}

/// Fans events out to any number of `AsyncStream`s. Publishing never blocks: each stream keeps the newest
/// `bufferLimit` events a slow reader has not taken yet and drops older ones.
final class EventHub: Sendable {
    static let bufferLimit = 1024
    private let state = Mutex<(next: Int, continuations: [Int: AsyncStream<WorkerEvent>.Continuation], finished: Bool)>(
        (0, [:], false))
    /// Called (outside the lock) when the first stream starts: the daemon client subscribes then.
    let onFirstSubscriber: (@Sendable () -> Void)?

    init(onFirstSubscriber: (@Sendable () -> Void)? = nil) { self.onFirstSubscriber = onFirstSubscriber }

    var hasSubscribers: Bool { state.withLock { !$0.continuations.isEmpty } }

    func stream() -> AsyncStream<WorkerEvent> {
        let (stream, continuation) = AsyncStream<WorkerEvent>.makeStream(bufferingPolicy: .bufferingNewest(Self.bufferLimit))
        let (key, first, finished) = state.withLock { s -> (Int, Bool, Bool) in
            if s.finished { return (0, false, true) }
            let key = s.next
            s.next += 1
            s.continuations[key] = continuation
            return (key, s.continuations.count == 1, false)
        }
        if finished {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in self?.state.withLock { _ = $0.continuations.removeValue(forKey: key) } }
        if first { onFirstSubscriber?() }
        return stream
    }

    func publish(_ event: WorkerEvent) {
        let continuations = state.withLock { Array($0.continuations.values) }
        for continuation in continuations { continuation.yield(event) }
    }

    /// Ends every stream (the host shut down); later `stream()` calls get a finished stream.
    func finishAll() {
        let continuations = state.withLock { s -> [AsyncStream<WorkerEvent>.Continuation] in
            s.finished = true
            defer { s.continuations = [:] }
            return Array(s.continuations.values)
        }
        for continuation in continuations { continuation.finish() }
    }
}
