// SDKDaemon: `sdk-host serve` — the host engine behind a Unix socket for many client processes.
// This file: the daemon's configuration (config/sdk-host.plist). Every key has a default; an unknown or
// ill-typed key is a startup error naming the key and the file. Relative paths are resolved against the folder
// holding the configuration file.
//
//   ExtensionSearchPaths      [string]  folders with <Name>/Info.plist        default: the bundled Extensions
//   ExecutableSearchPaths     [string]  folders with extension executables    default: sdk-host's own folder
//   SocketPath                string    the daemon's socket                    default: $XDG_RUNTIME_DIR/sdk-host.sock,
//                                                                               else /tmp/sdk-host-<uid>/sdk-host.sock
//   SocketMode                integer   permission bits of the socket file     default: 384 (0600)
//   AllowedUIDs               [integer] uids that may connect (SO_PEERCRED)    default: the daemon's uid
//   LogLevel                  string    debug | info | warning | error         default: info
//   CrashReportDirectory      string    one binary plist per worker crash      default: <socket folder>/crashes
//   MaxCrashReports           integer   reports kept (newest win)              default: 64
//   DrainTimeoutSeconds       number    SIGTERM: time in-flight requests get   default: 10
//   HeartbeatIntervalSeconds  number                                           default: 1
//   HeartbeatTimeoutSeconds   number                                           default: 10
//   CancelGraceSeconds        number    before a worker ignoring cancel dies   default: 2
//   MaxFrameBytes             integer   largest frame accepted                 default: 16777216
//   MaxClients                integer   connections at once; at the limit the  default: 256
//                                       oldest still without `connect` is
//                                       closed to make room, else refused
//   MaxClientsPerUID          integer   the same, per peer uid                 default: 128
//   MaxWorkersTotal           integer   worker processes at once, in all       default: 256
//   MaxWorkersPerUID          integer   ... for the apps of one uid            default: 64
//   MaxAppPoolsPerUID         integer   pools (extension x app name) with      default: 16
//                                       workers, per uid; at a cap a request
//                                       waits and an idle worker is retired
//   MaxInFlightRequests       integer   per client; more end as `overloaded`   default: 1024
//   MaxQueuedRequests         integer   per extension; more end `overloaded`   default: 1024
//   MaxClientOutputBytes      integer   unread replies before a client is no   default: 8388608
//                                       longer read (then disconnected)
//   MaxClientOutputBytesTotal integer   unread replies of all clients; past    default: 67108864
//                                       it, clients that took none of theirs
//                                       for PartialFrameTimeoutSeconds are
//                                       disconnected, the largest first, and
//                                       one over its share is not read
//   HandshakeTimeoutSeconds   number    to send `connect` after connecting     default: 5
//   PartialFrameTimeoutSeconds number   to finish a started frame, and for a   default: 5
//                                       stalled reader to catch up
//   MaxDescriptorsPerClient   integer   descriptor attachments one client's    default: 256
//                                       requests in flight may hold
//   MaxDescriptorsTotal       integer   the same across all clients            default: 4096
//   MaxUnreadDescriptorsPerClient       descriptors sent to a client that it   default: 2048
//                             integer   has not read; past it, disconnected
//   BusyPollMicroseconds      integer   0...1000: after handling a message,    default: 50
//                                       the loop and each worker poll this
//                                       long before sleeping (0: sleep at once)
//   DefaultPolicy             dict      SDKHostPolicy keys, for manifests that leave them out
//                                       (not ExecutableSHA256: that is one executable's)
//   WorkerUser                string    a root host's workers run as this      default: nobody
//                                       user (name, uid or uid:gid; never root)
//   RuntimePaths              [string]  read-only in every worker's root       default: the library folders,
//                                                                               ld.so.cache, the Swift runtime
// Operator ceilings: an extension whose policy exceeds one is refused, naming its manifest and the key.
//   AllowedSandboxModes       [string]  Sandbox modes a manifest may use       default: strict, bestEffort
//   MaxMemoryLimitMB          integer   largest MemoryLimitMB                  default: no ceiling
//   AllowedReadableRoots      [string]  ReadablePaths must lie under these     default: anywhere
//                                       (or under AllowedWritableRoots)
//   AllowedWritableRoots      [string]  WritablePaths must lie under these     default: anywhere
//   AllowNetwork              bool      whether NetworkAllowed may be true     default: true

import SDKWire
import SDKHost
import SDKPosix

#if canImport(Glibc)
import Glibc
#endif

package struct DaemonConfiguration: Sendable {
    package var host: HostConfiguration
    package var socketPath: String
    package var socketMode: mode_t = 0o600
    /// Whether the file named its `CrashReportDirectory` (else it is the socket folder's `crashes`, the daemon's).
    package var namesCrashReportDirectory = false
    package var allowedUIDs: [uid_t] = [getuid()]
    package var drainTimeout: Double = 10
    package var maxClients = 256
    package var maxClientsPerUID = 128
    package var maxInFlightRequests = 1024
    package var maxClientOutputBytes = 8 << 20
    package var maxClientOutputBytesTotal = 64 << 20
    package var handshakeTimeout: Double = 5
    package var partialFrameTimeout: Double = 5
    /// Input buffered across all clients (half-received frames), and bytes of requests held for all clients
    /// (queued or on their way to workers): ceilings that keep the daemon's memory bounded whatever clients send.
    package var inputBudgetBytes = 128 << 20
    package var pendingRequestBytesPerClient = 64 << 20
    package var pendingRequestBytesTotal = 128 << 20
    /// Descriptor attachments held by requests in flight, per client and in all: past either, a request ends
    /// `overloaded` and its descriptors are closed (a client cannot spend the daemon's descriptor limit).
    package var maxDescriptorsPerClient = 256
    /// Descriptors sent to a client (results' attachments) that it has not read; past it, it is disconnected.
    /// Two streams' worth: a worker may send 16 partial results uncredited, of up to 64 descriptors each, and a
    /// client reading as fast as it can had a quarter of one such burst unread when the limit was 256.
    package var maxUnreadDescriptorsPerClient = 2048
    package var maxDescriptorsTotal = 4096
    /// The file it was read from, if any.
    package var source: String?

    static let keys: Set<String> = [
        "ExtensionSearchPaths", "ExecutableSearchPaths", "SocketPath", "SocketMode", "AllowedUIDs", "LogLevel",
        "CrashReportDirectory", "MaxCrashReports", "DrainTimeoutSeconds", "HeartbeatIntervalSeconds",
        "HeartbeatTimeoutSeconds", "CancelGraceSeconds", "MaxFrameBytes", "DefaultPolicy", "MaxClients",
        "MaxInFlightRequests", "MaxQueuedRequests", "MaxClientOutputBytes", "MaxClientOutputBytesTotal", "HandshakeTimeoutSeconds",
        "PartialFrameTimeoutSeconds", "MaxDescriptorsPerClient", "MaxDescriptorsTotal", "BusyPollMicroseconds",
        "WorkerUser", "RuntimePaths", "AllowedSandboxModes", "MaxMemoryLimitMB", "AllowedReadableRoots",
        "AllowedWritableRoots", "AllowNetwork", "MaxClientsPerUID", "MaxWorkersTotal", "MaxWorkersPerUID",
        "MaxAppPoolsPerUID", "MaxUnreadDescriptorsPerClient", "Interpreters",
    ]

    /// Defaults only (no file).
    package init(defaultExtensionSearchPaths: [String]) {
        host = HostConfiguration(extensionSearchPaths: defaultExtensionSearchPaths)
        host.logLevel = .info
        socketPath = Self.defaultRuntimeDirectory() + "/sdk-host.sock"
        host.crashReportDirectory = Self.defaultRuntimeDirectory() + "/crashes"
    }

    /// Reads `path` over the defaults.
    ///
    /// - Throws: `HostError.Code.invalidConfiguration` naming the file and the key.
    /// Why no Unix socket can have `path`, or nil: its address holds 107 bytes of path, and a path that is empty or
    /// ends in "/" names no file. Checked for SocketPath and, at bind, for a path however it was given.
    static func socketPathProblem(_ path: String) -> String? {
        if path.isEmpty || path.hasSuffix("/") { return "'\(path)' names no socket file" }
        if path.utf8.count > 107 { return "'\(path)' is \(path.utf8.count) bytes; a Unix socket's path holds at most 107" }
        return nil
    }

    package init(contentsOf path: String, defaultExtensionSearchPaths: [String]) throws(HostError) {
        self.init(defaultExtensionSearchPaths: defaultExtensionSearchPaths)
        source = path
        let value: PlistValue
        do {
            value = try XMLPropertyList.parse(try readRegularFile(path, maxBytes: 1 << 20))
        } catch let error as XMLPlistError {
            throw HostError(.invalidConfiguration, "\(path): \(error)")
        } catch {
            throw HostError(.invalidConfiguration, "\(path): cannot read: \(error)")
        }
        let f = try PlistFields(value, file: path, errorCode: .invalidConfiguration)
        try f.rejectUnknownKeys(Self.keys)
        let base = path.contains("/") ? String(path[..<path.lastIndex(of: "/")!]) : "."
        func resolve(_ p: String) -> String { p.hasPrefix("/") ? p : "\(base)/\(p)" }

        if let paths = try f.stringArray("ExtensionSearchPaths") { host.extensionSearchPaths = paths.map(resolve) }
        if let paths = try f.stringArray("ExecutableSearchPaths") { host.executableSearchPaths = paths.map(resolve) }
        let crashDirectoryGiven = try f.string("CrashReportDirectory")
        if let socket = try f.string("SocketPath") {
            socketPath = resolve(socket)
            if let problem = Self.socketPathProblem(socket.isEmpty ? socket : socketPath) { throw f.fail("SocketPath", problem) }
            if crashDirectoryGiven == nil {
                host.crashReportDirectory = String(socketPath[..<(socketPath.lastIndex(of: "/") ?? socketPath.startIndex)]) + "/crashes"
            }
        }
        if let dir = crashDirectoryGiven {
            host.crashReportDirectory = resolve(dir)
            namesCrashReportDirectory = true
        }
        if let mode = try f.integer("SocketMode", in: 0...0o777) { socketMode = mode_t(mode) }
        if let level = try f.string("LogLevel") {
            guard let parsed = LogLevel(name: level) else {
                throw f.fail("LogLevel", "'\(level)' is not one of debug, info, warning, error")
            }
            host.logLevel = parsed
        }
        if let raw = f.entries["AllowedUIDs"] {
            guard case .array(let list) = raw else { throw f.mismatch("AllowedUIDs", expected: "an array of integers", found: raw) }
            allowedUIDs = try list.enumerated().map { (i, v) throws(HostError) -> uid_t in
                guard case .integer(let n) = v else {
                    throw f.mismatch("AllowedUIDs[\(i)]", expected: "a uid (non-negative integer)", found: v)
                }
                // An integer, but not one a uid can be: "expected … found integer" said nothing.
                guard let uid = uid_t(exactly: n), uid != uid_t.max else {
                    throw f.fail("AllowedUIDs[\(i)]", "\(n) is not a uid (0...\(uid_t.max - 1))")
                }
                return uid
            }
        }
        drainTimeout = try f.seconds("DrainTimeoutSeconds", minimum: 0) ?? drainTimeout
        try host.applyLimits(f)
        if let policy = try f.fields("DefaultPolicy") {
            guard policy.entries["ExecutableSHA256"] == nil else {
                throw policy.fail("ExecutableSHA256", "is one executable's digest; set it in that extension's manifest")
            }
            try host.defaultPolicy.apply(policy)
        }
        maxClients = try f.integer("MaxClients", in: 1...65_536) ?? maxClients
        maxClientsPerUID = try f.integer("MaxClientsPerUID", in: 1...65_536) ?? maxClientsPerUID
        maxInFlightRequests = try f.integer("MaxInFlightRequests", in: 1...1_000_000) ?? maxInFlightRequests
        maxClientOutputBytes = try f.integer("MaxClientOutputBytes", in: 65_536...(1 << 30)) ?? maxClientOutputBytes
        maxClientOutputBytesTotal = try f.integer("MaxClientOutputBytesTotal", in: 65_536...(1 << 40)) ?? maxClientOutputBytesTotal
        handshakeTimeout = try f.seconds("HandshakeTimeoutSeconds", minimum: 0.1) ?? handshakeTimeout
        partialFrameTimeout = try f.seconds("PartialFrameTimeoutSeconds", minimum: 0.1) ?? partialFrameTimeout
        maxDescriptorsPerClient = try f.integer("MaxDescriptorsPerClient", in: 0...1_000_000) ?? maxDescriptorsPerClient
        maxDescriptorsTotal = try f.integer("MaxDescriptorsTotal", in: 0...1_000_000) ?? maxDescriptorsTotal
        maxUnreadDescriptorsPerClient = try f.integer("MaxUnreadDescriptorsPerClient", in: 1...1_000_000) ?? maxUnreadDescriptorsPerClient
        if let user = try f.string("WorkerUser") {
            do throws(HostError) {
                _ = try WorkerIdentity(resolving: user)
            } catch {
                throw f.fail("WorkerUser", error.detail)
            }
            host.workerUser = user
        }
        host.runtimePaths = try ExtensionPolicy.grants(f, "RuntimePaths", needing: "every worker") ?? host.runtimePaths
        if let interpreters = try f.fields("Interpreters") {
            // Each key an interpreter's absolute path, each value the folders of its library.
            var table: [String: [String]] = [:]
            for key in interpreters.entries.keys.sorted() {
                guard ExtensionPolicy.isAbsoluteWithoutDotDot(key) else {
                    throw interpreters.fail(key, "'\(key)' is not an absolute path without '..'")
                }
                table[key] = try ExtensionPolicy.grants(interpreters, key, needing: "the interpreter") ?? []
            }
            host.interpreters = table
        }
        if let modes = try f.stringArray("AllowedSandboxModes") {
            host.allowedSandboxModes = []
            for mode in modes { host.allowedSandboxModes.insert(try SandboxMode(mode, key: "AllowedSandboxModes", in: f)) }
        }
        host.allowedReadableRoots = try ExtensionPolicy.paths(f, "AllowedReadableRoots") ?? host.allowedReadableRoots
        host.allowedWritableRoots = try ExtensionPolicy.paths(f, "AllowedWritableRoots") ?? host.allowedWritableRoots
        host.allowNetwork = try f.bool("AllowNetwork") ?? host.allowNetwork
    }

    /// Where the daemon keeps its socket and crash reports by default: $XDG_RUNTIME_DIR/sdk-host if set (a
    /// per-user 0700 folder by spec), else /tmp/sdk-host-<uid>.
    package static func defaultRuntimeDirectory() -> String {
        if let xdg = getenv("XDG_RUNTIME_DIR"), xdg.pointee != 0 { return String(cString: xdg) + "/sdk-host" }
        return "/tmp/sdk-host-\(getuid())"
    }

    /// Creates the socket's folder (0700) if needed and refuses one that another user owns or others can write.
    package func prepareSocketDirectory() throws(HostError) {
        let dir = String(socketPath[..<(socketPath.lastIndex(of: "/") ?? socketPath.startIndex)])
        guard !dir.isEmpty else { return }
        guard makeDirectories(dir, mode: 0o700) else {
            throw HostError(.invalidConfiguration, "socket folder \(dir): cannot create it: \(String(cString: strerror(errno)))")
        }
        var st = stat()
        guard stat(dir, &st) == 0 else { throw HostError(.invalidConfiguration, "socket folder \(dir): cannot stat it") }
        if dir.hasPrefix("/tmp/sdk-host-") && (st.st_uid != getuid() || st.st_mode & 0o077 != 0) {
            throw HostError(.invalidConfiguration,
                "socket folder \(dir) belongs to uid \(st.st_uid) or is open to others (mode \(String(st.st_mode & 0o777, radix: 8))); refusing to use it")
        }
        // Any folder: the rule every client checks before it connects.
        switch SocketFolderProblem(st) {
        case .ownedBy(let uid)?:
            throw HostError(.invalidConfiguration,
                "socket folder \(dir) belongs to uid \(uid), not to this daemon's user (uid \(getuid())) or root: "
                + "that user could replace the socket")
        case .writableByOthers(let mode)?:
            throw HostError(.invalidConfiguration,
                "socket folder \(dir) is writable by others (mode \(String(mode, radix: 8))): anyone could "
                + "replace the socket, and clients refuse such a folder; use one only its owner may write")
        case nil:
            break
        }
    }
}
