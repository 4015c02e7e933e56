// ExtensionManifest: an extension's Info.plist, read and validated, with its executable resolved.
//
//   CFBundleIdentifier            string, required
//   NSExtension                   dictionary, required
//     NSExtensionPointIdentifier  string, required
//     NSExtensionExecutable       string, required: the executable's file name
//     SDKHostPolicy               dictionary, optional; unknown keys are errors
//       MaxConcurrentRequests     integer 1...1024
//       MaxWorkers                integer 1...64
//       IdleTimeoutSeconds        number >= 0.1
//       RequestDeadlineSeconds    number >= 0.01 (omit for the host default)
//       MemoryLimitMB             integer 16...65536 (address space; default 2048)
//       NetworkAllowed            boolean (false)
//       AllowSubprocesses         boolean (false)
//       ReadablePaths             [absolute path]
//       WritablePaths             [absolute path]
//       Sandbox                   strict | bestEffort | none (strict)
//       RestartLimitBurst         integer 1...1000 (5)
//       RestartLimitIntervalSeconds number 0.1...3600 (10)
//       QuarantineSeconds         number 0.1...300 (10)
//       HangThresholdMilliseconds integer 1...3600000 (250)
//       MinWarmWorkers            integer 0...MaxWorkers (0)
//       MaxRequestsPerWorker      integer >= 1 (no limit)
//       MaxWorkerRSSMB            integer 16...65536 (no limit)
//       WorkerSharing             perApp | shared (perApp)
//       TempSizeMB                integer 1...65536 (64): the worker's own TMPDIR tmpfs
//       MaxThreads                integer 4...32768 (512): threads and processes at once
// Other top-level and NSExtension keys are allowed, as in Apple's Info.plist files.

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

    init(contentsOf path: String, defaults: ExtensionPolicy, executableSearchPaths: [String]) throws(HostError) {
        let bytes: [UInt8]
        do {
            bytes = try readFile(path)
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
        guard let ext = try top.fields("NSExtension") else {
            throw top.fail("NSExtension", "missing (required)")
        }
        extensionPoint = try ext.requiredString("NSExtensionPointIdentifier")
        executableName = try ext.requiredString("NSExtensionExecutable")
        guard !executableName.contains("/") else {
            throw ext.fail("NSExtensionExecutable", "must be a file name, not a path")
        }
        var policy = defaults
        if let p = try ext.fields("SDKHostPolicy") { try policy.apply(p) }
        self.policy = policy
        manifestPath = path
        let manifestDirectory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        let searched = executableSearchPaths + [manifestDirectory]
        let name = executableName
        searchedPaths = searched
        executablePath = searched.lazy.map { "\($0)/\(name)" }.first { access($0, X_OK) == 0 }
    }

    /// Reads every `<dir>/<Name>/Info.plist` under the search paths. Later duplicates of an identifier are errors.
    static func discover(in configuration: HostConfiguration) throws(HostError) -> [String: ExtensionManifest] {
        var found: [String: ExtensionManifest] = [:]
        for directory in configuration.extensionSearchPaths {
            guard let entries = listDirectory(directory) else {
                throw HostError(.invalidConfiguration, "extension search path \(directory) is not a readable directory")
            }
            for entry in entries.sorted() {
                let manifestPath = "\(directory)/\(entry)/Info.plist"
                guard access(manifestPath, R_OK) == 0 else { continue }
                let manifest = try ExtensionManifest(
                    contentsOf: manifestPath, defaults: configuration.defaultPolicy,
                    executableSearchPaths: configuration.executableSearchPaths)
                if let existing = found[manifest.identifier] {
                    throw HostError(.invalidManifest,
                        "\(manifestPath): identifier \(manifest.identifier) is already used by \(existing.manifestPath)")
                }
                found[manifest.identifier] = manifest
            }
        }
        return found
    }
}

extension ExtensionPolicy {
    static let keys: Set<String> = [
        "MaxConcurrentRequests", "MaxWorkers", "IdleTimeoutSeconds", "RequestDeadlineSeconds", "MemoryLimitMB",
        "NetworkAllowed", "AllowSubprocesses", "ReadablePaths", "WritablePaths", "Sandbox",
        "RestartLimitBurst", "RestartLimitIntervalSeconds", "QuarantineSeconds", "HangThresholdMilliseconds",
        "MinWarmWorkers", "MaxRequestsPerWorker", "MaxWorkerRSSMB", "WorkerSharing", "Environment",
        "LeakCheckDelaySeconds", "TempSizeMB", "MaxThreads",
    ]

    /// Overrides the keys present in `p` (a manifest's SDKHostPolicy or the config's DefaultPolicy).
    package mutating func apply(_ p: PlistFields) throws(HostError) {
        try p.rejectUnknownKeys(Self.keys)
        maxConcurrentRequests = try p.integer("MaxConcurrentRequests", in: 1...1024) ?? maxConcurrentRequests
        maxWorkers = try p.integer("MaxWorkers", in: 1...64) ?? maxWorkers
        idleTimeout = try p.seconds("IdleTimeoutSeconds", minimum: 0.1) ?? idleTimeout
        requestDeadline = try p.seconds("RequestDeadlineSeconds", minimum: 0.01) ?? requestDeadline
        memoryLimitMB = try p.integer("MemoryLimitMB", in: 16...65536) ?? memoryLimitMB
        networkAllowed = try p.bool("NetworkAllowed") ?? networkAllowed
        allowSubprocesses = try p.bool("AllowSubprocesses") ?? allowSubprocesses
        readablePaths = try Self.paths(p, "ReadablePaths") ?? readablePaths
        writablePaths = try Self.paths(p, "WritablePaths") ?? writablePaths
        if let mode = try p.string("Sandbox") {
            guard let parsed = SandboxMode(rawValue: mode) else {
                throw p.fail("Sandbox", "'\(mode)' is not one of strict, bestEffort, none")
            }
            sandbox = parsed
        }
        restartLimitBurst = try p.integer("RestartLimitBurst", in: 1...1000) ?? restartLimitBurst
        restartLimitInterval = try p.seconds("RestartLimitIntervalSeconds", minimum: 0.1) ?? restartLimitInterval
        guard restartLimitInterval <= 3600 else { throw p.fail("RestartLimitIntervalSeconds", "at most 3600") }
        quarantineSeconds = try p.seconds("QuarantineSeconds", minimum: 0.1) ?? quarantineSeconds
        guard quarantineSeconds <= 300 else { throw p.fail("QuarantineSeconds", "at most 300") }
        if let ms = try p.integer("HangThresholdMilliseconds", in: 1...3_600_000) { hangThreshold = Double(ms) / 1000 }
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
        leakCheckDelay = try p.seconds("LeakCheckDelaySeconds", minimum: 0) ?? leakCheckDelay
        guard leakCheckDelay <= 3600 else { throw p.fail("LeakCheckDelaySeconds", "at most 3600") }
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

    /// Absolute paths without NUL or "..", at most 256 of them (manifest grants and the config's RuntimePaths).
    package static func paths(_ p: PlistFields, _ key: String) throws(HostError) -> [String]? {
        guard let paths = try p.stringArray(key) else { return nil }
        guard paths.count <= 256 else { throw p.fail(key, "\(paths.count) paths; at most 256") }
        for path in paths {
            guard path.hasPrefix("/"), !path.utf8.contains(0), !path.split(separator: "/").contains("..") else {
                throw p.fail(key, "'\(path)' is not an absolute path without '..'")
            }
        }
        return paths
    }
}

import SDKPosix
