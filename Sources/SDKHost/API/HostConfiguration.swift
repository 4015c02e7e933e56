// HostConfiguration: where extensions are and how the host treats them. Embedded mode builds one in code;
// the daemon reads config/sdk-host.plist into the same struct.
import SDKWire
import Dispatch
import SDKPosix
import Synchronization

/// Limits and policy for one extension. Manifests override the configuration's defaults key by key.
public struct ExtensionPolicy: Sendable, Equatable {
    /// Requests one worker runs at once.
    public var maxConcurrentRequests = 8
    /// Workers the host runs for the extension at once.
    public var maxWorkers = 2
    /// How long an idle worker lives before the host retires it. Manifest key `IdleTimeoutSeconds`.
    public var idleTimeout: Duration {
        get { .seconds(idleTimeoutSeconds) }
        set { idleTimeoutSeconds = seconds(newValue) }
    }
    package var idleTimeoutSeconds: Double = 30
    /// How long a request may run: past it the request ends interrupted with `timedOut`, and its worker is told
    /// to cancel it (and killed only if it ignores that for `cancelGracePeriod`); nil for no deadline. Manifest
    /// key `RequestDeadlineSeconds`.
    public var requestDeadline: Duration? {
        get { requestDeadlineSeconds.map { .seconds($0) } }
        set { requestDeadlineSeconds = newValue.map(seconds) }
    }
    package var requestDeadlineSeconds: Double? = 30
    /// The worker's address-space limit (RLIMIT_AS: every mapping, anonymous, shared and memfd alike), in
    /// MiB; also the largest file it may write. nil for none.
    public var memoryLimitMB: Int? = 2048
    /// Whether the extension may use the network (sockets other than Unix ones). Manifest key `NetworkAllowed`.
    public var networkAllowed = false
    /// Whether the extension may start processes. They die with the worker all the same.
    /// Manifest key `AllowSubprocesses`.
    public var allowSubprocesses = false
    /// Absolute paths (files or folders) the worker may read. Manifest key `ReadablePaths`.
    public var readablePaths: [String] = []
    /// Absolute paths the worker may read, write, create and remove under. Manifest key `WritablePaths`.
    public var writablePaths: [String] = []
    /// How much of the sandbox the worker must run under. Manifest key `Sandbox`.
    public var sandbox = SandboxMode.strict
    /// The size of the worker's `TMPDIR`, a tmpfs of its own, in MiB. Manifest key `TempSizeMB`.
    public var tempSizeMB = 64
    /// Threads (and processes) the worker may have at once. Manifest key `MaxThreads`.
    public var maxThreads = 512
    /// The SHA-256 of the executable (64 hex digits), checked by the launcher on the very descriptor it execs; a
    /// mismatch fails the launch. nil checks nothing. Manifest key `ExecutableSHA256`.
    public var executableSHA256: String?

    // Supervision (shared/DESIGN.md "Supervision and isolation").

    /// Workers that die on their own this many times within `restartLimitInterval` quarantine the extension.
    /// Manifest key `RestartLimitBurst`.
    public var restartLimitBurst = 5
    /// The window for `restartLimitBurst`. Manifest key `RestartLimitIntervalSeconds`.
    public var restartLimitInterval: Duration {
        get { .seconds(restartLimitIntervalSeconds) }
        set { restartLimitIntervalSeconds = seconds(newValue) }
    }
    package var restartLimitIntervalSeconds: Double = 10
    /// The first quarantine; each further one doubles it, up to 5 minutes. Manifest key `QuarantineSeconds`.
    public var firstQuarantine: Duration {
        get { .seconds(quarantineSeconds) }
        set { quarantineSeconds = seconds(newValue) }
    }
    package var quarantineSeconds: Double = 10
    /// A request running longer than this is reported as slow (a report; it is not ended for it). Manifest key
    /// `SlowRequestThresholdMilliseconds`.
    public var slowRequestThreshold: Duration {
        get { .seconds(slowRequestThresholdSeconds) }
        set { slowRequestThresholdSeconds = seconds(newValue) }
    }
    package var slowRequestThresholdSeconds: Double = 0.25
    /// Workers kept started and handshaken even with no request. Manifest key `MinWarmWorkers`.
    public var minWarmWorkers = 0
    /// A worker that has been sent this many requests takes no more, finishes them and exits; nil for no
    /// limit. Manifest key `MaxRequestsPerWorker`.
    public var maxRequestsPerWorker: Int?
    /// A worker whose resident memory passes this many MiB is recycled the same way; nil for no limit.
    /// Manifest key `MaxWorkerRSSMB`.
    public var maxWorkerRSSMB: Int?
    /// Whether the daemon gives each client app its own workers. Manifest key `WorkerSharing`.
    public var workerSharing = WorkerSharing.perApp
    /// Environment variables given to the extension's workers, after the host's own (`PATH`, `LANG`,
    /// `SDKHOST_*`) and the configuration's `workerEnvironment`; a name here replaces theirs, except that
    /// `SDKHOST_` names are reserved. Manifest key `Environment` (a dictionary of strings); empty by default.
    public var environment: [String: String] = [:]
    /// How long after a request ends the worker runtime expects its `ExtensionContext` (and an async handler's
    /// Task) to be gone; if not, it reports a leak. Zero turns the check off. Manifest key
    /// `LeakCheckDelaySeconds`.
    public var leakCheckDelay: Duration {
        get { .seconds(leakCheckDelaySeconds) }
        set { leakCheckDelaySeconds = seconds(newValue) }
    }
    package var leakCheckDelaySeconds: Double = 2
    /// The app's services (`Extension.registerService`) the extension may call; a call to any other ends at once
    /// with an error and never reaches the app. Manifest key `HostServices` (an array of names); none by default.
    public var hostServices: Set<String> = []
    /// Calls to host services one request may have in flight; the worker runtime fails one more at once, and a
    /// worker that sends it anyway breaks the protocol. Manifest key `MaxHostCallsInFlight` (1...1024, 16).
    public var maxHostCallsInFlight = 16

    /// Creates the default policy.
    public init() {}
}

/// Whether the daemon's client apps share an extension's workers.
public enum WorkerSharing: String, Sendable, Equatable, CaseIterable {
    /// Each app (peer uid plus the app name its client library sends) gets its own workers: one app's
    /// crash-inducing input never interrupts another app's request. The default.
    case perApp
    /// Every app's requests go to the same workers; for extensions that are safe to share.
    case shared
}

/// Everything an embedded host needs to know.
public struct HostConfiguration: Sendable {
    /// Folders searched for `<Name>/Info.plist` manifests.
    public var extensionSearchPaths: [String]
    /// Folders searched for extension executables. The manifest's own folder is searched after these.
    public var executableSearchPaths: [String]
    /// Policy for extensions whose manifests leave a key out.
    public var defaultPolicy = ExtensionPolicy()
    /// How often the host pings each worker. The worker's runtime answers from its own thread, whatever its
    /// handlers are doing. Config key `HeartbeatIntervalSeconds`.
    public var heartbeatInterval: Duration {
        get { .seconds(heartbeatIntervalSeconds) }
        set { heartbeatIntervalSeconds = seconds(newValue) }
    }
    package var heartbeatIntervalSeconds: Double = 0.5
    /// A worker that has not answered a ping for this long is killed (interruption "hang"). With the defaults a
    /// stopped or wedged worker is killed 2.5 to 3 s after its last answer. Config key `HeartbeatTimeoutSeconds`.
    public var heartbeatTimeout: Duration {
        get { .seconds(heartbeatTimeoutSeconds) }
        set { heartbeatTimeoutSeconds = seconds(newValue) }
    }
    package var heartbeatTimeoutSeconds: Double = 2.5
    /// How long a worker may take to honour a cancel before it is killed. Config key `CancelGraceSeconds`.
    public var cancelGracePeriod: Duration {
        get { .seconds(cancelGracePeriodSeconds) }
        set { cancelGracePeriodSeconds = seconds(newValue) }
    }
    package var cancelGracePeriodSeconds: Double = 2
    /// Frame and decoding limits for worker traffic.
    public var wireLimits = WireLimits()
    /// Messages below this level are not logged.
    public var logLevel: LogLevel = .warning
    /// Where the host's log lines go (a worker's crash, a protocol violation, a sandbox layer bestEffort left
    /// out): each message with its level, on the host's own thread, with what a peer wrote escaped. nil, the
    /// default, logs nothing: an app's stderr is its own. `HostConfiguration.standardErrorLog` writes
    /// "sdk-host: level: message" lines to stderr (the daemon and the CLI use it).
    public var logHandler: (@Sendable (LogLevel, String) -> Void)?
    /// A `logHandler` that writes "sdk-host: level: message" lines to stderr, never blocking the host: when
    /// stderr is not read, lines are dropped and counted. Lines still buffered when the process calls `exit()` are
    /// written first, for at most 1 s.
    public static let standardErrorLog: @Sendable (LogLevel, String) -> Void = { level, message in
        LogWriter.standardError.write("sdk-host: \(level): \(message)\n")
    }
    /// Extra environment variables for workers ("KEY=value"). Workers do not inherit the host's environment.
    public var workerEnvironment: [String] = []
    /// Crash reports kept in memory, and on disk when `crashReportDirectory` is set (the newest win).
    public var crashReportLimit = 64
    /// A folder to write each crash report to, as a binary plist; nil keeps them in memory only.
    public var crashReportDirectory: String?
    /// Requests that may wait for a worker, per pool (an extension, or an extension and one daemon app); past it a
    /// request ends at once as `overloaded`. (A request whose worker died before its handshake goes back to the
    /// front of its queue regardless.)
    public var maxQueuedRequests = 1024
    /// Worker processes at once, across every extension and app (retiring ones included). At the cap a request
    /// waits and an idle worker elsewhere is retired to make room. Config key `MaxWorkersTotal`.
    public var maxWorkersTotal = 256
    /// Worker processes at once for the apps of one uid (the daemon). Config key `MaxWorkersPerUID`.
    public var maxWorkersPerUID = 64
    /// Pools (one per extension and app name) with workers at once, per uid (the daemon): an app name is only
    /// a label, so one user cannot make a pool per name. Config key `MaxAppPoolsPerUID`.
    public var maxAppPoolsPerUID = 16
    /// How long workers get to exit (and flush their output) when the host stops, before they are killed.
    public var workerExitGracePeriod: Duration {
        get { .seconds(workerExitGracePeriodSeconds) }
        set { workerExitGracePeriodSeconds = seconds(newValue) }
    }
    package var workerExitGracePeriodSeconds: Double = 1
    /// After handling something, how long the host's event loop and each worker poll for the next message before
    /// they sleep, in microseconds (0...1000; 0 sleeps at once). A request sent one at a time then usually finds
    /// the other side awake, which saves the wake-up of a sleeping CPU on each hop. An idle host polls once for
    /// this long and then sleeps; every empty poll yields the CPU to whatever else is ready on it.
    public var busyPollMicroseconds = HostConfiguration.defaultBusyPollMicroseconds
    /// The default `busyPollMicroseconds`: Linux's suggested `net.core.busy_poll`.
    public static let defaultBusyPollMicroseconds = 50
    /// The `busyPollMicroseconds` a host accepts (also the daemon's `BusyPollMicroseconds`).
    package static let busyPollMicrosecondsRange = 0...1000
    /// Creates workers (tests substitute failing or in-process launchers); nil for posix_spawn.
    package var launcher: (any WorkerLauncher)?
    /// Makes and removes workers' temp folders; nil for the file system (the simulation keeps them in memory).
    package var workerFolders: (any WorkerFolders)?
    /// The sandbox launcher; nil looks for `sdk-host-launcher` next to the running executable, then in
    /// `executableSearchPaths`.
    public var launcherPath: String?
    /// Where each worker's private temp folder is made (and removed when the worker exits). Used only where the
    /// kernel refuses a worker its own root (bestEffort); a sandboxed worker's TMPDIR is a tmpfs of its own.
    public var temporaryDirectory = "/tmp"
    /// The user a root host's workers run as: a name from /etc/passwd, or `uid` or `uid:gid`. Never root. An
    /// unprivileged host's workers run as its own user. Config key `WorkerUser`; default `nobody`.
    public var workerUser = "nobody"
    /// What a worker's root holds besides its executable and its grants, read-only: the system library folders,
    /// the loader's cache and the Swift runtime, so that an extension built the ordinary way (dynamically) runs.
    /// The operator's list, never derived from an extension's files. Config key `RuntimePaths`.
    public var runtimePaths = HostConfiguration.defaultRuntimePaths
    /// The interpreters a manifest may name with `SDKHostInterpreter` (absolute paths), each with the folders it
    /// needs to run: an interpreted worker's root holds the interpreter and those folders read-only **in place of**
    /// `runtimePaths` (and the machine's site-packages and dist-packages folders among them are hidden). A manifest
    /// that names any other interpreter is refused. The operator's list; config key `Interpreters`. By default
    /// /usr/bin/python3 and /usr/local/bin/python3, where they are, with their `lib/python3.X` folder, the C
    /// library folder and the loader's.
    public var interpreters: [String: [String]] = HostConfiguration.defaultInterpreters

    // Operator ceilings (shared/DESIGN.md "Sandbox"): no manifest, nor DefaultPolicy, asks for more. An extension
    // whose policy does is refused (`HostError.Code.refused`), naming its manifest and the key.

    /// The `Sandbox` modes an extension may use. Config key `AllowedSandboxModes`; by default strict and
    /// bestEffort, so that `none` runs only where the operator allows it.
    public var allowedSandboxModes: Set<SandboxMode> = [.strict, .bestEffort]
    /// The largest `MemoryLimitMB` an extension may ask for (and no extension may go without one); nil for no
    /// ceiling. Config key `MaxMemoryLimitMB`.
    public var maxMemoryLimitMB: Int?
    /// Folders under which every `ReadablePaths` (and `WritablePaths`) entry must lie, as written and with its
    /// symbolic links resolved; nil for anywhere. Config key `AllowedReadableRoots`.
    public var allowedReadableRoots: [String]?
    /// Folders under which every `WritablePaths` entry must lie, as written and resolved; nil for anywhere.
    /// Config key `AllowedWritableRoots`.
    public var allowedWritableRoots: [String]?
    /// Whether any extension may have `NetworkAllowed`. Config key `AllowNetwork`; true by default.
    public var allowNetwork = true
    /// The launcher times each of its steps and reports them (`WorkerStatus.sandboxMicroseconds`): the
    /// bench's per-layer cost. Off by default: each step's clock read is a system call in the launcher.
    package var measuresSandboxLayers = false
    /// Adjusts every manifest's policy after it is read (`sdk-host conformance` shortens the timeouts it tests and
    /// lists its own host service).
    package var adjustPolicy: (@Sendable (inout ExtensionPolicy) -> Void)?
    /// What the engine reads from the file system as it starts, read once beforehand; nil: each engine reads
    /// them (`EngineStartInputs.read`). The simulation starts an engine per schedule from the same files. Only
    /// the start uses them: a reload (SIGHUP) reads the manifests again.
    package var startInputs: EngineStartInputs?
    /// Drives the engine's timers by hand (tests and the simulation); nil for the monotonic clock.
    package var clock: ManualClock?
    /// Who watches workers' exit notices; nil: `ExitNoticeWatcher.shared` (the simulation brings its own).
    package var exitNoticeWatcher: (any ExitNoticeWatching)?
    /// The engine's loop has no thread: its owner runs it with `loop.runUntilIdle()` (the simulation, which runs
    /// everything on one thread). Needs `clock`.
    package var drivenLoop = false
    /// The daemon: keep each worker frame's payload while it is handled, so that a completion can be forwarded
    /// byte for byte (`SubmittedRequest.deliverForwarded`).
    package var forwardsPayloads = false

    /// Creates a configuration.
    ///
    /// - Parameters:
    ///   - extensionSearchPaths: Folders holding one sub-folder per extension, each with an Info.plist.
    ///   - executableSearchPaths: Folders holding the extension executables; by default the folder of the
    ///     running executable, which is where `swift build` puts every product.
    public init(extensionSearchPaths: [String], executableSearchPaths: [String]? = nil) {
        self.extensionSearchPaths = extensionSearchPaths
        self.executableSearchPaths = executableSearchPaths ?? [currentExecutableDirectory()].compactMap { $0 }
    }
}

extension HostConfiguration {
    /// The system library folders that exist here, the loader's cache, and the Swift runtime folder of the
    /// toolchain found on PATH (`<toolchain>/usr/lib/swift/linux`) or at /opt/swift.
    public static let defaultRuntimePaths: [String] = {
        var paths = ["/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache"]
        var toolchains = ["/opt/swift/usr/bin/swift"]
        if let path = getenv("PATH").map({ String(cString: $0) }) {
            toolchains = path.split(separator: ":").map { "\($0)/swift" } + toolchains
        }
        for candidate in toolchains {
            guard let real = realpath(candidate, nil) else { continue }
            let binary = String(cString: real)
            free(real)
            let usr = binary.split(separator: "/").dropLast(2).joined(separator: "/")
            paths.append("/\(usr)/lib/swift/linux")
            break
        }
        var seen = Set<String>()
        return paths.filter { access($0, F_OK) == 0 && seen.insert($0).inserted }
    }()
}

extension HostConfiguration {
    /// `python3` in /usr/bin and /usr/local/bin, where it is an executable file named `python3.X` (through its
    /// links), each with what it needs to run and nothing more: `<prefix>/lib/python3.X` (its standard library),
    /// the machine's C library folder (`/usr/lib/<arch>-linux-gnu`), the loader's folders and cache. A name, not a
    /// byte of the interpreter, says where its library is.
    public static let defaultInterpreters: [String: [String]] = {
        var machine = utsname()
        uname(&machine)
        let arch = withUnsafeBytes(of: &machine.machine) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        let system = ["/lib", "/lib64", "/usr/lib64", "/usr/lib/\(arch)-linux-gnu", "/etc/ld.so.cache"]
        var found: [String: [String]] = [:]
        for prefix in ["/usr", "/usr/local"] {
            let path = "\(prefix)/bin/python3"
            guard access(path, X_OK) == 0, let real = realpath(path, nil) else { continue }
            let resolved = String(cString: real)
            free(real)
            let name = resolved.split(separator: "/").last.map(String.init) ?? ""
            guard name.hasPrefix("python3."), name.dropFirst(8).allSatisfy(\.isNumber), !name.dropFirst(8).isEmpty else { continue }
            let library = "\(prefix)/lib/\(name)"
            guard access(library, R_OK) == 0 else { continue }
            found[path] = ([library] + system + (prefix == "/usr" ? [] : ["\(prefix)/lib"])).filter { access($0, F_OK) == 0 }
        }
        return found
    }()
}

/// What an engine reads from the file system as it starts: the workers' user (from /etc/passwd), the sandbox
/// launcher's path, and the manifests in the search paths with the problems of those it skipped.
package struct EngineStartInputs: Sendable {
    let workerIdentity: WorkerIdentity
    let launcherPath: String?
    let manifests: [String: ExtensionManifest]
    let problems: [HostError]

    /// Reads them as `configuration` says.
    ///
    /// - Throws: `HostError` for a `workerUser` that names no user, or a search path that is not a folder.
    package static func read(_ configuration: HostConfiguration) throws(HostError) -> EngineStartInputs {
        let identity: WorkerIdentity
        do throws(HostError) {
            identity = try WorkerIdentity(resolving: configuration.workerUser)
        } catch {
            throw HostError(error.code, "workerUser: \(error.detail)")
        }
        let launcherPath = SandboxProfile.findLauncher(configured: configuration.launcherPath,
                                                       searchPaths: configuration.executableSearchPaths)
        let (found, problems) = try ExtensionManifest.discover(in: configuration)
        return EngineStartInputs(workerIdentity: identity, launcherPath: launcherPath, manifests: found, problems: problems)
    }
}

/// The uid and gid a root host's workers run as.
package struct WorkerIdentity: Sendable, Equatable {
    var uid: UInt32
    var gid: UInt32

    init(uid: UInt32, gid: UInt32) {
        self.uid = uid
        self.gid = gid
    }

    /// `uid`, `uid:gid`, or a user name looked up in /etc/passwd (its primary group). Root is refused. The
    /// error's detail names the value, not the key: the caller says where it came from.
    package init(resolving user: String) throws(HostError) {
        let fields = user.split(separator: ":", omittingEmptySubsequences: false)
        if let uid = UInt32(fields[0]) {
            guard fields.count <= 2, let gid = fields.count == 2 ? UInt32(fields[1]) : uid else {
                throw HostError(.invalidConfiguration, "'\(user)' is not a name, a uid or uid:gid")
            }
            self.init(uid: uid, gid: gid)
        } else {
            // Only a line whose name field is the user's is split (every engine resolves this once: split whole,
            // a passwd file cost more than the rest of the engine's start). The name is compared whole: a value
            // with a ':' in it names no user.
            let passwd = (try? readFile("/etc/passwd")) ?? []
            let colon = UInt8(ascii: ":")
            let entry = passwd.split(separator: UInt8(ascii: "\n")).lazy
                .filter { $0.prefix { $0 != colon }.elementsEqual(user.utf8) }
                .map { $0.split(separator: colon, omittingEmptySubsequences: false) }
                .first { $0.count >= 4 }
            func number(_ field: ArraySlice<UInt8>) -> UInt32? { UInt32(String(decoding: field, as: UTF8.self)) }
            if let entry, let uid = number(entry[2]), let gid = number(entry[3]) {
                self.init(uid: uid, gid: gid)
            } else if user == "nobody" {
                self.init(uid: 65534, gid: 65534)  // the conventional nobody, where /etc/passwd has none
            } else {
                throw HostError(.invalidConfiguration, "no user '\(user)' in /etc/passwd")
            }
        }
        guard uid != 0, gid != 0 else {
            throw HostError(.invalidConfiguration, "'\(user)' is root; workers never run as root")
        }
    }
}

/// The running executable's path (/proc/self/exe), or nil.
///
/// Read once (every `HostConfiguration()` asked, one readlink each): a process's image is the same file until it
/// ends, and an exec makes a new image that reads it again. A read that failed is tried again at the next call.
/// A folder renamed while the process runs is not followed (nor was the file: a replaced executable read as
/// "<path> (deleted)").
package func currentExecutablePath() -> String? {
    if let known = executablePathOfThisProcess.withLock({ $0 }) { return known }
    var buffer = [CChar](repeating: 0, count: 4096)
    let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
    guard n > 0 else { return nil }
    let path = String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    executablePathOfThisProcess.withLock { $0 = path }
    return path
}

private let executablePathOfThisProcess = Mutex<String?>(nil)

/// The running executable's file name (/proc/self/exe), or nil.
func currentExecutableName() -> String? {
    currentExecutablePath()?.split(separator: "/").last.map(String.init)
}

extension HostConfiguration {
    /// The folder of the running executable (/proc/self/exe), or nil: the default executable search path, where
    /// SwiftPM puts an app's extension executables and `sdk-host-launcher` beside the app.
    public static var executableDirectory: String? { currentExecutableDirectory() }
}

/// The folder of the running executable (/proc/self/exe), or nil.
package func currentExecutableDirectory() -> String? {
    guard let path = currentExecutablePath(), let slash = path.lastIndex(of: "/") else { return nil }
    return String(path[..<slash])
}

#if canImport(Glibc)
import Glibc
#endif
