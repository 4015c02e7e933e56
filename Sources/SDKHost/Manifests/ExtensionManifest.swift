// ExtensionManifest: an extension's Info.plist, read and validated, with its executable resolved.
//
//   CFBundleIdentifier            string, required
//   NSExtension                   dictionary, required
//     NSExtensionPointIdentifier  string, required
//     NSExtensionExecutable       string, required: the executable's file name (with SDKHostInterpreter: the
//                                 script's, in the manifest's folder)
//     SDKHostInterpreter          absolute path, optional (also read at the top level): the launcher runs this
//                                 interpreter with the script; it must be one of the operator's `Interpreters`
//     SDKHostPolicy               dictionary, optional; unknown keys are errors
//       MaxConcurrentRequests     integer 1...1024
//       MaxWorkers                integer 1...64
//       IdleTimeoutSeconds        number >= 0.1
//       RequestDeadlineSeconds    number >= 0.01 (omit for the host default)
//       MemoryLimitMB             integer 16...65536 (address space; default 2048)
//       NetworkAllowed            boolean (false)
//       AllowSubprocesses         boolean (false)
//       ReadablePaths             [absolute path, not /]
//       WritablePaths             [absolute path, not /]
//       Sandbox                   strict | bestEffort | none (strict)
//       RestartLimitBurst         integer 1...1000 (5)
//       RestartLimitIntervalSeconds number 0.1...3600 (10)
//       QuarantineSeconds         number 0.1...300 (10)
//       SlowRequestThresholdMilliseconds integer 1...3600000 (250): a longer request is reported as slow
//                                 (HangThresholdMilliseconds, its old name, is still read)
//       MinWarmWorkers            integer 0...MaxWorkers (0)
//       MaxRequestsPerWorker      integer >= 1 (no limit)
//       MaxWorkerRSSMB            integer 16...65536 (no limit)
//       WorkerSharing             perApp | shared (perApp)
//       TempSizeMB                integer 1...65536 (64): the worker's own TMPDIR tmpfs
//       MaxThreads                integer 4...32768 (512): threads and processes at once
//       ExecutableSHA256          64 hex digits: checked on the descriptor the launcher execs
//       HostServices              [name] (none): the app's services the extension may call
//       MaxHostCallsInFlight      integer 1...1024 (16): host calls of one request at once
// Other top-level and NSExtension keys are allowed, as in Apple's Info.plist files.
//
// An extension is refused (listed, but every request to it ends `launch failed: <why>`) when the manifest, its
// folder or the executable is owned by a user other than root and the host's, or is writable by others (as sshd's
// StrictModes), or when its policy exceeds an operator ceiling (HostConfiguration.allowedSandboxModes and the
// rest). A refused manifest never displaces, nor conflicts with, another manifest of the same identifier.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif

/// A validated extension manifest.
final class ExtensionManifest: Sendable {
    let identifier: String
    let extensionPoint: String
    let executableName: String
    /// The resolved executable path, or nil if it was not found (reported when the extension is requested).
    let executablePath: String?
    let searchedPaths: [String]
    let policy: ExtensionPolicy
    let manifestPath: String
    /// Why the extension may not run, if it may not: its files' ownership or modes, or an operator ceiling.
    let refusal: HostError?
    /// `SDKHostInterpreter`: what the launcher execs, with the script (`executablePath`) as its argument; nil for
    /// an executable of its own.
    let interpreter: String?
    /// The interpreter's library folders, from the operator's `Interpreters`.
    let interpreterLibraryPaths: [String]

    /// The largest manifest read (a real one is a few KB): a bigger file is refused, not parsed.
    static let maxManifestBytes = 1 << 20

    init(contentsOf path: String, configuration: HostConfiguration) throws(HostError) {
        let bytes: [UInt8]
        do {
            bytes = try readRegularFile(path, maxBytes: Self.maxManifestBytes)
        } catch {
            throw HostError(.invalidManifest, "\(path): cannot read: \(error)")
        }
        let value: PlistValue
        do {
            value = try XMLPropertyList.parse(bytes)
        } catch {
            throw HostError(.invalidManifest, "\(path): \(error)")
        }
        let top = try PlistFields(value, file: path, errorCode: .invalidManifest)
        identifier = try top.requiredString("CFBundleIdentifier")
        guard Self.isBundleIdentifier(identifier) else {
            throw top.fail("CFBundleIdentifier", "'\(identifier.displaySafe())' is not a bundle identifier (1 to 255 of "
                + "A-Z, a-z, 0-9, '-' and '.', with no '.' first, last or twice in a row)")
        }
        guard let ext = try top.fields("NSExtension") else {
            throw top.fail("NSExtension", "missing (required)")
        }
        extensionPoint = try ext.requiredString("NSExtensionPointIdentifier")
        executableName = try ext.requiredString("NSExtensionExecutable")
        guard !executableName.contains("/") else {
            throw ext.fail("NSExtensionExecutable", "must be a file name, not a path")
        }
        var policy = configuration.defaultPolicy
        if let p = try ext.fields("SDKHostPolicy") { try policy.apply(p) }
        configuration.adjustPolicy?(&policy)
        self.policy = policy
        manifestPath = path
        let manifestDirectory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        let interpreter = try Self.interpreter(top, ext)
        if interpreter != nil, policy.executableSHA256 != nil {
            throw ext.fail("SDKHostInterpreter", "ExecutableSHA256 pins an executable, and with an interpreter the "
                + "launcher execs the interpreter: give one or the other")
        }
        self.interpreter = interpreter
        interpreterLibraryPaths = interpreter.flatMap { configuration.interpreters[$0] } ?? []
        // A script is read, not executed: it lies beside its manifest, and its folder is what the worker's root
        // holds of it (its modules, the runtime beside it).
        let searched = interpreter == nil ? configuration.executableSearchPaths + [manifestDirectory] : [manifestDirectory]
        let name = executableName
        searchedPaths = searched
        var executable: String? = searched.map { "\($0)/\(name)" }.first {
            interpreter == nil ? access($0, X_OK) == 0 : isRegularReadableFile($0)
        }
        // A script's folder is bound into the worker's root, which takes absolute paths only: resolved here, from
        // a search path given relative to the working directory. It must be the manifest's own folder: a script
        // that is a link elsewhere would have the host bind whatever folder the link points into.
        var scriptProblem: String?
        if interpreter != nil, let script = executable {
            let real = resolvedPath(script), folder = resolvedPath(manifestDirectory.isEmpty ? "/" : manifestDirectory)
            if let real, let folder, real.hasPrefix(folder + "/"), !real.dropFirst(folder.count + 1).contains("/") {
                executable = real
            } else {
                scriptProblem = "\(script) is a link out of its manifest's folder (it resolves to \(real ?? "nothing"))"
            }
        }
        executablePath = executable
        let checked: [String] = [path, manifestDirectory.isEmpty ? "/" : manifestDirectory] + (executable.map { [$0] } ?? [])
            + (interpreter.map { [$0] } ?? [])
        let unlisted = interpreter.flatMap { configuration.interpreters[$0] == nil ? $0 : nil }.map { interpreter in
            "\(path): SDKHostInterpreter \(interpreter) is not one of the operator's Interpreters ("
                + (configuration.interpreters.isEmpty ? "none" : configuration.interpreters.keys.sorted().joined(separator: ", ")) + ")"
        }
        // Everything in an interpreted extension's folder may be imported or read as code (its modules, the
        // runtime, their caches): each file and folder in it is held to the same ownership rule as the script.
        let folderProblem = interpreter == nil || executable == nil ? nil
            : ownershipProblemInTree(String(executable![..<executable!.lastIndex(of: "/")!]))
        let problem = unlisted ?? scriptProblem ?? checked.lazy.compactMap { ownershipProblem($0) }.first ?? folderProblem
            ?? policy.ceilingProblem(configuration).map { "\(path): \($0)" }
        let id = identifier
        refusal = problem.map { HostError(.refused, "\(id): refused: \($0)") }
    }

    /// A manifest that is not valid, kept under the identifier it names so that asking for it says why.
    init(invalid path: String, identifier: String, error: HostError) {
        self.identifier = identifier
        extensionPoint = ""
        executableName = ""
        executablePath = nil
        searchedPaths = []
        policy = ExtensionPolicy()
        manifestPath = path
        refusal = error
        interpreter = nil
        interpreterLibraryPaths = []
    }

    /// `SDKHostInterpreter`, from the NSExtension dictionary or the top level (not both, unless they agree): an
    /// absolute path without `..`.
    private static func interpreter(_ top: PlistFields, _ ext: PlistFields) throws(HostError) -> String? {
        let key = "SDKHostInterpreter"
        let inner = try ext.string(key), outer = try top.string(key)
        if let inner, let outer, inner != outer { throw top.fail(key, "differs from NSExtension.\(key) ('\(inner)')") }
        guard let value = inner ?? outer else { return nil }
        guard ExtensionPolicy.isAbsoluteWithoutDotDot(value) else {
            throw (inner != nil ? ext : top).fail(key, "'\(value)' is not an absolute path without '..'")
        }
        return value
    }

    /// Reads every `<dir>/<Name>/Info.plist` under the search paths. One bad manifest never breaks the others:
    /// an invalid one is skipped and returned among `problems` (the host logs each); when it names an
    /// identifier, asking for that identifier throws its error. A later duplicate of an identifier is skipped
    /// the same way. Only a search path that cannot be read is an error.
    static func discover(in configuration: HostConfiguration) throws(HostError)
        -> (found: [String: ExtensionManifest], problems: [HostError])
    {
        var found: [String: ExtensionManifest] = [:]
        var problems: [HostError] = []
        for directory in configuration.extensionSearchPaths {
            guard let entries = listDirectory(directory) else {
                throw HostError(.invalidConfiguration, "extension search path \(directory) is not a readable directory")
            }
            for entry in entries.sorted() {
                let manifestPath = "\(directory)/\(entry)/Info.plist"
                guard access(manifestPath, R_OK) == 0 else { continue }
                let manifest: ExtensionManifest
                do {
                    manifest = try ExtensionManifest(contentsOf: manifestPath, configuration: configuration)
                } catch {
                    problems.append(error)
                    if let id = identifier(in: manifestPath), found[id] == nil {
                        found[id] = ExtensionManifest(invalid: manifestPath, identifier: id, error: error)
                    }
                    continue
                }
                if let existing = found[manifest.identifier] {
                    // A refused or invalid manifest never takes an identifier from one that may run.
                    if manifest.refusal != nil { continue }
                    if existing.refusal != nil {
                        found[manifest.identifier] = manifest
                        continue
                    }
                    problems.append(HostError(.invalidManifest, "\(manifestPath): identifier \(manifest.identifier) is "
                        + "already used by \(existing.manifestPath)"))
                    continue
                }
                found[manifest.identifier] = manifest
            }
        }
        return (found, problems)
    }

    /// Whether `id` is a bundle identifier as Apple's are: letters, digits, '-' and '.', in dot-separated parts.
    /// It names files (crash reports) and lines of output: a '/' in it sent a crash report out of its folder
    /// ("../../x": none was written, and nothing said so), a newline forged a line of `sdk-host crashes`.
    static func isBundleIdentifier(_ id: String) -> Bool {
        let bytes = Array(id.utf8)
        guard (1...255).contains(bytes.count), bytes.first != UInt8(ascii: "."), bytes.last != UInt8(ascii: ".") else {
            return false
        }
        var previous: UInt8 = 0
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"):
                break
            case UInt8(ascii: "."):
                if previous == UInt8(ascii: ".") { return false }
            default:
                return false
            }
            previous = byte
        }
        return true
    }

    /// The `CFBundleIdentifier` an invalid manifest names, if it can be read at all: kept only to look up (asking
    /// for it says why it is refused), so any that shows as it is and fits is taken, a bundle identifier or not.
    private static func identifier(in path: String) -> String? {
        guard let bytes = try? readRegularFile(path, maxBytes: maxManifestBytes), let value = try? XMLPropertyList.parse(bytes),
            let id = value["CFBundleIdentifier"]?.stringValue, (1...255).contains(id.utf8.count), id.displaySafe() == id
        else { return nil }
        return id
    }
}

extension ExtensionPolicy {
    static let keys: Set<String> = [
        "MaxConcurrentRequests", "MaxWorkers", "IdleTimeoutSeconds", "RequestDeadlineSeconds", "MemoryLimitMB",
        "NetworkAllowed", "AllowSubprocesses", "ReadablePaths", "WritablePaths", "Sandbox",
        "RestartLimitBurst", "RestartLimitIntervalSeconds", "QuarantineSeconds", "SlowRequestThresholdMilliseconds", "HangThresholdMilliseconds",
        "MinWarmWorkers", "MaxRequestsPerWorker", "MaxWorkerRSSMB", "WorkerSharing", "Environment",
        "LeakCheckDelaySeconds", "TempSizeMB", "MaxThreads", "ExecutableSHA256", "HostServices", "MaxHostCallsInFlight",
    ]

    /// Overrides the keys present in `p` (a manifest's SDKHostPolicy or the config's DefaultPolicy).
    package mutating func apply(_ p: PlistFields) throws(HostError) {
        try p.rejectUnknownKeys(Self.keys)
        maxConcurrentRequests = try p.integer("MaxConcurrentRequests", in: 1...1024) ?? maxConcurrentRequests
        maxWorkers = try p.integer("MaxWorkers", in: 1...64) ?? maxWorkers
        idleTimeoutSeconds = try p.seconds("IdleTimeoutSeconds", minimum: 0.1) ?? idleTimeoutSeconds
        requestDeadlineSeconds = try p.seconds("RequestDeadlineSeconds", minimum: 0.01) ?? requestDeadlineSeconds
        memoryLimitMB = try p.integer("MemoryLimitMB", in: 16...65536) ?? memoryLimitMB
        networkAllowed = try p.bool("NetworkAllowed") ?? networkAllowed
        allowSubprocesses = try p.bool("AllowSubprocesses") ?? allowSubprocesses
        readablePaths = try Self.grants(p, "ReadablePaths") ?? readablePaths
        writablePaths = try Self.grants(p, "WritablePaths") ?? writablePaths
        if let mode = try p.string("Sandbox") { sandbox = try SandboxMode(mode, key: "Sandbox", in: p) }
        restartLimitBurst = try p.integer("RestartLimitBurst", in: 1...1000) ?? restartLimitBurst
        restartLimitIntervalSeconds = try p.seconds("RestartLimitIntervalSeconds", minimum: 0.1) ?? restartLimitIntervalSeconds
        guard restartLimitIntervalSeconds <= 3600 else { throw p.fail("RestartLimitIntervalSeconds", "at most 3600") }
        quarantineSeconds = try p.seconds("QuarantineSeconds", minimum: 0.1) ?? quarantineSeconds
        guard quarantineSeconds <= 300 else { throw p.fail("QuarantineSeconds", "at most 300") }
        // A slow request is reported, not ended: "hang" is a worker that stops answering its heartbeat.
        if p.entries["SlowRequestThresholdMilliseconds"] != nil, p.entries["HangThresholdMilliseconds"] != nil {
            throw p.fail("HangThresholdMilliseconds", "is the old name of SlowRequestThresholdMilliseconds; give one")
        }
        for key in ["SlowRequestThresholdMilliseconds", "HangThresholdMilliseconds"] {
            if let ms = try p.integer(key, in: 1...3_600_000) { slowRequestThresholdSeconds = Double(ms) / 1000 }
        }
        maxRequestsPerWorker = try p.integer("MaxRequestsPerWorker", in: 1...Int(Int32.max)) ?? maxRequestsPerWorker
        maxWorkerRSSMB = try p.integer("MaxWorkerRSSMB", in: 16...65536) ?? maxWorkerRSSMB
        if let mode = try p.string("WorkerSharing") {
            guard let parsed = WorkerSharing(rawValue: mode) else {
                throw p.fail("WorkerSharing", "'\(mode)' is not one of perApp, shared")
            }
            workerSharing = parsed
        }
        minWarmWorkers = try p.integer("MinWarmWorkers", in: 0...64) ?? minWarmWorkers
        guard minWarmWorkers <= maxWorkers else {
            throw p.fail("MinWarmWorkers", "\(minWarmWorkers) is more than MaxWorkers (\(maxWorkers))")
        }
        if let env = try Self.environment(p, "Environment") { environment = env }
        tempSizeMB = try p.integer("TempSizeMB", in: 1...65536) ?? tempSizeMB
        maxThreads = try p.integer("MaxThreads", in: 4...32768) ?? maxThreads
        leakCheckDelaySeconds = try p.seconds("LeakCheckDelaySeconds", minimum: 0) ?? leakCheckDelaySeconds
        if let digest = try p.string("ExecutableSHA256") {
            let hex = digest.lowercased()
            guard hex.utf8.count == 64, hex.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }) else {
                throw p.fail("ExecutableSHA256", "'\(digest)' is not 64 hex digits")
            }
            executableSHA256 = hex
        }
        guard leakCheckDelaySeconds <= 3600 else { throw p.fail("LeakCheckDelaySeconds", "at most 3600") }
        if let names = try p.stringArray("HostServices") {
            guard names.count <= 64 else { throw p.fail("HostServices", "\(names.count) services; at most 64") }
            for name in names where !Self.isServiceName(name) {
                throw p.fail("HostServices", "'\(name)' is not a service name (1 to 128 letters, digits, '.', '-' and '_')")
            }
            hostServices = Set(names)
        }
        maxHostCallsInFlight = try p.integer("MaxHostCallsInFlight", in: 1...1024) ?? maxHostCallsInFlight
    }

    /// A service name: 1 to 128 ASCII letters, digits, '.', '-' and '_' (it is logged and shown as it is).
    package static func isServiceName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        return (1...128).contains(bytes.count) && bytes.allSatisfy {
            ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x2E || $0 == 0x2D || $0 == 0x5F
        }
    }

    /// Names of letters, digits and `_` (not first a digit, not `SDKHOST_`); values without NUL; at most 256
    /// variables and 64 KiB in all, so a manifest cannot make spawning fail with E2BIG.
    static func environment(_ p: PlistFields, _ key: String) throws(HostError) -> [String: String]? {
        guard let fields = try p.fields(key) else { return nil }
        guard fields.entries.count <= 256 else { throw p.fail(key, "\(fields.entries.count) variables; at most 256") }
        var out: [String: String] = [:]
        var total = 0
        for name in fields.entries.keys.sorted() {
            guard let value = try fields.string(name) else { continue }
            let bytes = Array(name.utf8)
            let valid = !bytes.isEmpty && !(bytes[0] >= 0x30 && bytes[0] <= 0x39) && bytes.allSatisfy {
                ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x5F
            }
            guard valid else { throw fields.fail(name, "not a valid variable name (letters, digits and _)") }
            guard !name.hasPrefix("SDKHOST_") else { throw fields.fail(name, "SDKHOST_ names are reserved for the host") }
            guard !value.utf8.contains(0) else { throw fields.fail(name, "the value contains a NUL byte") }
            total += bytes.count + value.utf8.count + 2
            guard total <= 65536 else { throw p.fail(key, "more than 64 KiB of variables") }
            out[name] = value
        }
        return out
    }

    /// `paths`, none of them the root, as written or through links: a worker's root is built of what it is
    /// granted, and the whole file system is not a grant (it cannot be bound over the root, so it was skipped at
    /// every launch with a warning). The config's RuntimePaths and Interpreters folders are checked the same way
    /// (`needing` says whose folders to name).
    package static func grants(_ p: PlistFields, _ key: String, needing whose: String = "the extension") throws(HostError) -> [String]? {
        let paths = try paths(p, key)
        if let root = paths?.first(where: { $0.split(separator: "/").allSatisfy { $0 == "." } || resolvedPath($0) == "/" }) {
            throw p.fail(key, "'\(root)' is the whole file system; name the folders \(whose) needs")
        }
        return paths
    }

    /// Whether `path` is absolute, without NUL and without a ".." part: the rule for every path a manifest or the
    /// configuration names (grants, RuntimePaths, an interpreter and its folders).
    package static func isAbsoluteWithoutDotDot(_ path: String) -> Bool {
        path.hasPrefix("/") && !path.utf8.contains(0) && !path.split(separator: "/").contains("..")
    }

    /// Absolute paths without NUL or "..", at most 256 of them (manifest grants and the config's RuntimePaths).
    package static func paths(_ p: PlistFields, _ key: String) throws(HostError) -> [String]? {
        guard let paths = try p.stringArray(key) else { return nil }
        guard paths.count <= 256 else { throw p.fail(key, "\(paths.count) paths; at most 256") }
        for path in paths {
            guard isAbsoluteWithoutDotDot(path) else {
                throw p.fail(key, "'\(path)' is not an absolute path without '..'")
            }
        }
        return paths
    }
}

import SDKPosix

/// `path` with its links resolved, or nil if it does not exist.
func resolvedPath(_ path: String) -> String? {
    guard let real = realpath(path, nil) else { return nil }
    defer { free(real) }
    return String(cString: real)
}

/// The first file or folder under `folder` (itself excluded, links not followed, at most 16 levels and 4096
/// entries) that `ownershipProblem` refuses, or why the tree is too large to check.
func ownershipProblemInTree(_ folder: String) -> String? {
    var pending = [(folder, 0)]
    var seen = 0
    while let (dir, depth) = pending.popLast() {
        for name in (listDirectory(dir) ?? []).sorted() {
            seen += 1
            guard seen <= 4096 else { return "\(folder) holds more than 4096 files and folders; too many to check" }
            let path = "\(dir)/\(name)"
            var info = stat()
            guard lstat(path, &info) == 0 else { continue }
            if info.st_mode & S_IFMT == S_IFLNK { continue }  // resolved in the worker's root, where only grants are
            if let problem = ownershipProblem(path) { return problem }
            if info.st_mode & S_IFMT == S_IFDIR {
                guard depth < 16 else { return "\(path) is more than 16 folders deep; too deep to check" }
                pending.append((path, depth + 1))
            }
        }
    }
    return nil
}

/// Whether `path` is a regular file this process can read (a script, which need not be executable).
func isRegularReadableFile(_ path: String) -> Bool {
    var info = stat()
    return stat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFREG && access(path, R_OK) == 0
}

/// Why the file or folder at `path` may not be trusted (sshd's StrictModes), or nil: it must be owned by root or
/// the host's user, and not writable by others (nor by its group, unless that group is root's or the host's own).
func ownershipProblem(_ path: String) -> String? {
    var info = stat()
    guard stat(path, &info) == 0 else { return "\(path): cannot stat: \(String(cString: strerror(errno)))" }
    let owner = info.st_uid
    guard owner == 0 || owner == geteuid() else {
        return "\(path) is owned by uid \(owner), neither root nor the host's uid \(geteuid())"
    }
    let mode = String(info.st_mode & 0o7777, radix: 8)
    if info.st_mode & S_IWOTH != 0 {
        return "\(path) is writable by others (mode \(mode))"
    }
    if info.st_mode & S_IWGRP != 0 && info.st_gid != 0 && info.st_gid != getegid() {
        return "\(path) is writable by its group \(info.st_gid) (mode \(mode))"
    }
    return nil
}

extension SandboxMode {
    /// The mode named `raw`, a value of `key` in `p` (a manifest's `Sandbox`, the config's `AllowedSandboxModes`).
    ///
    /// - Throws: `HostError` naming the file, the key and the three modes.
    package init(_ raw: String, key: String, in p: PlistFields) throws(HostError) {
        guard let mode = SandboxMode(rawValue: raw) else {
            throw p.fail(key, "'\(raw)' is not one of " + Self.allCases.map(\.rawValue).joined(separator: ", "))
        }
        self = mode
    }
}

extension ExtensionPolicy {
    /// The first way this policy exceeds the operator's ceilings in `configuration`, or nil.
    func ceilingProblem(_ configuration: HostConfiguration) -> String? {
        if !configuration.allowedSandboxModes.contains(sandbox) {
            let allowed = SandboxMode.allCases.filter(configuration.allowedSandboxModes.contains).map(\.rawValue)
            return "Sandbox \(sandbox.rawValue) is not in the operator's AllowedSandboxModes (\(allowed.joined(separator: ", ")))"
        }
        if let ceiling = configuration.maxMemoryLimitMB, (memoryLimitMB ?? Int.max) > ceiling {
            return "MemoryLimitMB \(memoryLimitMB.map(String.init) ?? "none") is over the operator's MaxMemoryLimitMB \(ceiling)"
        }
        if networkAllowed && !configuration.allowNetwork {
            return "NetworkAllowed is refused by the operator's AllowNetwork false"
        }
        if let roots = configuration.allowedWritableRoots, let path = writablePaths.first(where: { !Self.path($0, isUnder: roots) }) {
            return "WritablePaths '\(path)' is outside the operator's AllowedWritableRoots"
        }
        if let roots = configuration.allowedReadableRoots {
            let both = roots + (configuration.allowedWritableRoots ?? [])
            if let path = readablePaths.first(where: { !Self.path($0, isUnder: both) }) {
                return "ReadablePaths '\(path)' is outside the operator's AllowedReadableRoots"
            }
        }
        return nil
    }

    /// Whether `path`, both as written and with its symbolic links resolved (where it exists), lies under one of
    /// `roots` (compared component by component; a root's own links are resolved too).
    static func path(_ path: String, isUnder roots: [String]) -> Bool {
        func components(_ p: String) -> [Substring] { p.split(separator: "/").filter { $0 != "." } }
        func resolved(_ p: String) -> String? {
            guard let real = realpath(p, nil) else { return nil }
            defer { free(real) }
            return String(cString: real)
        }
        func under(_ p: String) -> Bool {
            roots.contains { root in
                [root, resolved(root)].compactMap { $0 }.contains { components(p).starts(with: components($0)) }
            }
        }
        return under(path) && (resolved(path).map(under) ?? true)
    }
}
