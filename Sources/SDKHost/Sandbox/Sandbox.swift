// Sandbox, host side: the profile each worker is launched under (docs/SECURITY.md, shared/DESIGN.md "Sandbox").
//
// The host does not confine anything itself: it spawns `sdk-host-launcher` in the worker's place with the
// profile on descriptor 4, and the launcher builds the worker's namespaces and root, applies the layers and
// execs the extension. Here the host works out what the profile holds: the extension's executable, the
// operator's runtime folders (`HostConfiguration.runtimePaths`), the manifest's paths, the worker's uid and
// limits, and a private temp folder (used only where the kernel refuses a new root under bestEffort). The host
// reads no byte of the extension's files: what a worker may see never comes from the extension itself.

#if canImport(Glibc)
import SDKWire
import Synchronization
import Glibc
#endif
import SDKPosix

/// How much of the sandbox an extension must run under (manifest key `Sandbox`).
public enum SandboxMode: String, Sendable, Equatable, CaseIterable {
    /// Every layer, or the launch fails (`launch failed: sandbox: <layer> unavailable: <why>`). The default.
    case strict
    /// What the kernel allows; the layers it refuses are logged at warning.
    case bestEffort
    /// No confinement (logged at warning at every launch): only the parent-death signal and the rlimits.
    case none
}

/// The name of the launcher executable, looked up next to the running executable and in the executable
/// search paths.
let launcherExecutableName = "sdk-host-launcher"

/// The status the launcher exits with when it could not apply the profile.
let launcherFailureStatus: Int32 = 125

/// What every worker may read besides its grants and the runtime folders: the CPU count (sysconf) and the time
/// zone. Its own /proc and /dev/null, zero, random and urandom the launcher gives it in its new root.
let runtimeReadablePaths = ["/sys/devices/system/cpu", "/etc/localtime"]

/// Descriptors a worker may have open at once (RLIMIT_NOFILE).
let workerDescriptorLimit = 1024

extension ExtensionPolicy {
    /// Whether its workers get a private temp folder on the host: where the kernel may refuse them a root of
    /// their own (bestEffort) or they run unconfined (none). A strict worker's TMPDIR is its root's own tmpfs.
    var usesWorkerFolder: Bool { sandbox != .strict }
}

/// What the engine needs to spawn one worker under its profile.
struct SandboxedSpawn {
    var request: SpawnRequest
    /// The private temp folder to remove when the worker has exited.
    var temporaryDirectory: String?
}

package enum SandboxProfile {
    /// Builds the spawn request for `manifest`'s executable `path`: through the launcher, with the profile.
    static func spawn(
        _ manifest: ExtensionManifest, executable path: String, environment: [String], launcher: String?,
        runtimePaths: [String], worker: WorkerIdentity, temporaryBase: String, premadeDirectory: String? = nil,
        folders: any WorkerFolders = FileSystemFolders(),
        measured: Bool = false, networkNamespace: Int32 = -1, deviceFolder: String? = nil, rootTemplates: String? = nil
    ) throws(HostError) -> SandboxedSpawn {
        let policy = manifest.policy
        // With an interpreter the launcher execs it, with the script as its argument; the root holds the
        // interpreter, its library folders and the script's folder, and hides the machine's package folders.
        let executable = manifest.interpreter ?? path
        let arguments = [executable] + (manifest.interpreter == nil ? [] : [path])
        let scriptFolder = manifest.interpreter == nil ? [] : [String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])]
        // An interpreted worker's root holds what its interpreter needs (the operator's `Interpreters`), not the
        // runtime folders an executable needs: all of /usr/lib is other programs' code to import.
        let runtimePaths = manifest.interpreter == nil ? runtimePaths : manifest.interpreterLibraryPaths
        guard let launcher else {
            guard policy.sandbox == .none, policy.executableSHA256 == nil else {
                throw HostError(.system, "sandbox: launcher unavailable: \(launcherExecutableName) not found next to "
                    + "the host executable or in the executable search paths"
                    + (policy.sandbox == .none ? " (ExecutableSHA256 is checked by the launcher)" : ""))
            }
            if let premadeDirectory { folders.remove(premadeDirectory) }
            return SandboxedSpawn(request: SpawnRequest(path: executable, arguments: arguments, environment: environment))
        }
        // Under strict the worker's TMPDIR is its root's own tmpfs (no root, no launch): no folder on the host.
        let temporary: String?
        if !policy.usesWorkerFolder {
            temporary = nil
        } else if let premadeDirectory {
            temporary = premadeDirectory
        } else {
            temporary = try folders.make(in: temporaryBase)
        }
        // A root host's bestEffort worker runs as WorkerUser: its folder is made its own here, so that it stays
        // writable wherever the worker gets no root (the launcher, in a user namespace by then, could not chown it).
        if let temporary, geteuid() == 0, policy.sandbox == .bestEffort {
            _ = chown(temporary, worker.uid, worker.gid)
        }
        var env = environment.filter { !$0.hasPrefix("TMPDIR=") }
        env.append("TMPDIR=\(temporary ?? "/tmp")")
        // Written field by field (no dictionary to hash, no `PlistValue` tree): one profile per spawn.
        var profile: [(StaticString, FieldValue)] = [
            ("Extension", .string(manifest.identifier)),
            ("Executable", .string(executable)),
            ("Arguments", .strings(arguments)),
            ("Environment", .strings(env)),
            ("HostPID", .integer(Int64(ThisProcess.id))),
            ("Sandbox", .string(policy.sandbox.rawValue)),
            ("NetworkAllowed", .bool(policy.networkAllowed)),
            ("AllowSubprocesses", .bool(policy.allowSubprocesses)),
            ("DescriptorLimit", .integer(Int64(workerDescriptorLimit))),
            ("ExecutablePaths", .strings([executable] + runtimePaths)),
            ("RuntimePaths", .strings(runtimePaths)),
            ("ReadablePaths", .strings(runtimeReadablePaths + scriptFolder + policy.readablePaths)),
            ("WritablePaths", .strings([temporary].compactMap { $0 } + policy.writablePaths)),
            ("WorkerUID", .integer(Int64(worker.uid))),
            ("WorkerGID", .integer(Int64(worker.gid))),
            ("TempSizeMB", .integer(Int64(policy.tempSizeMB))),
            ("MaxThreads", .integer(Int64(policy.maxThreads))),
        ]
        if manifest.interpreter != nil {
            // Granted folders stay visible: the manifest's, and a package folder the operator lists for the
            // interpreter by name (the interpreter's other folders are what the masks are inside of).
            let listedPackages = manifest.interpreterLibraryPaths.filter {
                $0.split(separator: "/").contains { $0 == "site-packages" || $0 == "dist-packages" }
            }
            let granted = policy.readablePaths + policy.writablePaths + listedPackages
            let masked = packageFolders(in: runtimePaths).filter { !ExtensionPolicy.path($0, isUnder: granted) }
            if !masked.isEmpty { profile.append(("MaskedPaths", .strings(masked))) }
        }
        if let mb = policy.memoryLimitMB { profile.append(("MemoryLimitMB", .integer(Int64(mb)))) }
        if let digest = policy.executableSHA256 { profile.append(("ExecutableSHA256", .string(digest))) }
        if measured { profile.append(("Timings", .bool(true))) }
        if networkNamespace >= 0 { profile.append(("SharedNetworkNamespace", .bool(true))) }
        if let deviceFolder { profile.append(("DeviceFolder", .string(deviceFolder))) }
        if let rootTemplates { profile.append(("RootTemplates", .string(rootTemplates))) }
        if let temporary { profile.append(("WorkerFolder", .string(temporary))) }
        var bytes: [UInt8] = []
        BinaryPlistEncoder.encode(fields: profile, appendingTo: &bytes)
        guard bytes.count <= SpawnRequest.maxProfileBytes else {
            if let temporary { folders.remove(temporary) }
            throw HostError(.invalidManifest, "\(manifest.manifestPath): the sandbox profile is \(bytes.count) bytes, "
                + "over \(SpawnRequest.maxProfileBytes): ReadablePaths or WritablePaths are too long")
        }
        var request = SpawnRequest(path: launcher, arguments: [launcherExecutableName, manifest.identifier],
                                   environment: [], profile: bytes)
        request.networkNamespace = networkNamespace
        return SandboxedSpawn(request: request, temporaryDirectory: temporary)
    }

    /// The machine's Python package folders under `roots` (`<root>/python*/site-packages` and `dist-packages`,
    /// and the two under a root that is itself a `python*` folder): an interpreted worker's root hides them, so
    /// that what the machine installed is not the extension's to import unless a manifest grants it. Read at each
    /// interpreted spawn (a few directory reads beside the interpreter's ~15 ms start), so that a folder a package
    /// manager adds later is hidden too.
    static func packageFolders(in roots: [String]) -> [String] {
        var seen = Set<String>()
        var found: [String] = []
        for root in roots {
            let name = root.split(separator: "/").last.map(String.init) ?? ""
            let parents = name.hasPrefix("python") ? [root]
                : (listDirectory(root, prefix: "python") ?? []).sorted().map { "\(root)/\($0)" }
            for parent in parents {
                for leaf in ["site-packages", "dist-packages"] {
                    // Resolved: a root reached through a link (/lib -> usr/lib) is a link in the worker's root too,
                    // and its folders are covered where they really are.
                    guard let real = resolvedPath("\(parent)/\(leaf)") else { continue }
                    var info = stat()
                    guard stat(real, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, seen.insert(real).inserted else { continue }
                    found.append(real)
                }
            }
        }
        return found
    }

    /// Finds the launcher: `configured`, else next to the running executable, else in `searchPaths`.
    package static func findLauncher(configured: String?, searchPaths: [String]) -> String? {
        if let configured { return access(configured, X_OK) == 0 ? configured : nil }
        let folders = [currentExecutableDirectory()].compactMap { $0 } + searchPaths
        return folders.lazy.map { "\($0)/\(launcherExecutableName)" }.first { access($0, X_OK) == 0 }
    }

    /// A new folder `<base>/sdk-host-worker.XXXXXX`, mode 0700.
    static let workerDirectoryPrefix = "sdk-host-worker."
    /// A root host's folder of device nodes (`makeDeviceFolder`): `sdk-host-devices.<host pid>.XXXXXX`.
    static let deviceFolderPrefix = "sdk-host-devices."

    /// A folder holding /dev/null, zero, random and urandom (mknod: a root host only), bound as one /dev into
    /// every worker's root instead of four binds (~70 µs of each cold start here). nil where nodes cannot be made
    /// or would not open there (a nodev file system): the launcher then binds the machine's four.
    static func makeDeviceFolder(in base: String) -> String? {
        guard geteuid() == 0, let folder = makeHostFolder(in: base, prefix: deviceFolderPrefix) else { return nil }
        var info = statvfs()
        let nodes: [(String, UInt)] = [("null", 3), ("zero", 5), ("random", 8), ("urandom", 9)]
        let made = chmod(folder, 0o755) == 0 && statvfs(folder, &info) == 0 && info.f_flag & 4 /* ST_NODEV */ == 0
            && nodes.allSatisfy { name, minor in
                // Major 1 (memory devices); the old encoding (major << 8 | minor) is valid for these numbers.
                mknod("\(folder)/\(name)", S_IFCHR | 0o666, dev_t(1 << 8 | minor)) == 0 && chmod("\(folder)/\(name)", 0o666) == 0
            }
        guard made else {
            removeTree(folder)
            return nil
        }
        return folder
    }

    /// The folder of a root host's root templates, `<base>/sdk-host-roots.0` (made here, mode 0700), or nil when
    /// the host is not root or it is not a folder of root's that no one else may enter. Each template is the empty
    /// mount points of one set of grants, which the launcher builds once and clones read-only as each worker's root
    /// instead of making them again (~4 µs a folder here, about twenty a root). Only a root host's: a worker runs
    /// as another uid, which cannot enter the folder, while an unprivileged host's worker has the host's own uid
    /// and could write into every later root through a grant that reaches the folder. Kept across hosts, at most
    /// `maxRootTemplates`; removing the folder while no host runs is harmless.
    static func rootTemplateFolder(in base: String) -> String? {
        guard geteuid() == 0 else { return nil }
        let folder = "\(base)/sdk-host-roots.0"
        if mkdir(folder, 0o700) != 0, errno != EEXIST { return nil }
        var info = stat()
        guard lstat(folder, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, info.st_uid == 0,
              info.st_mode & 0o077 == 0 else { return nil }
        return folder
    }

    /// The launcher builds no template past this many (MAX_TEMPLATES in root.c).
    static let maxRootTemplates = 256

    /// A private folder for one worker, named `sdk-host-worker.<host pid>.XXXXXX` so that a later host can tell
    /// whose it was (`removeOrphanedWorkerDirectories`).
    static func makeWorkerDirectory(in base: String) throws(HostError) -> String {
        guard let folder = makeHostFolder(in: base, prefix: workerDirectoryPrefix) else {
            throw HostError(.system, "cannot make a temp folder in \(base): \(SystemError("mkdtemp", errno: errno))")
        }
        return folder
    }

    /// A new folder `<base>/<prefix><host pid>.XXXXXX` (mkdtemp, mode 0700), or nil with errno set: named so that
    /// `removeOrphanedWorkerDirectories` can tell whose it was.
    private static func makeHostFolder(in base: String, prefix: String) -> String? {
        var template = Array("\(base)/\(prefix)\(getpid()).XXXXXX".utf8CString)
        guard template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) != nil }) else { return nil }
        return String(decoding: template.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The temporary folders this process has swept, or is sweeping (`claimOrphanSweep`).
    private static let swept = Mutex<Set<String>>([])

    /// Whether `base` is this process's to sweep now (`removeOrphanedWorkerDirectories`): true the first time a
    /// host of this process uses it. Orphans are left by hosts of other processes, so one sweep per process finds
    /// them, and an app that makes many hosts neither reads a large temporary folder again for each (the read
    /// competed with the new host's first spawn) nor wakes a thread to find it swept.
    static func claimOrphanSweep(of base: String) -> Bool {
        swept.withLock { $0.insert(base).inserted }
    }

    /// A host killed with SIGKILL cannot remove its workers' folders (the workers die with it). The next host
    /// removes the folders in `base` whose host pid no longer exists, if they are real folders owned by this
    /// user; another user's, or a live host's, are never touched. Returns how many it removed.
    @discardableResult
    static func removeOrphanedWorkerDirectories(in base: String) -> Int {
        var removed = 0
        let names = (listDirectory(base, prefix: workerDirectoryPrefix) ?? []).map { ($0, workerDirectoryPrefix) }
            + (listDirectory(base, prefix: deviceFolderPrefix) ?? []).map { ($0, deviceFolderPrefix) }
        for (name, prefix) in names {
            let fields = name.dropFirst(prefix.count).split(separator: ".", maxSplits: 1)
            guard fields.count == 2, let pid = pid_t(fields[0]), pid > 0, pid != getpid() else { continue }
            guard kill(pid, 0) != 0, errno == ESRCH else { continue }  // its host is alive (or not ours to ask)
            let path = "\(base)/\(name)"
            var info = stat()
            guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, info.st_uid == geteuid() else { continue }
            if removeTree(path) { removed += 1 }
        }
        return removed
    }
}

/// Removes `path` and everything under it without following symbolic links (the tree was the worker's to
/// fill). Stops at 64 levels. Returns whether it is gone.
@discardableResult
package func removeTree(_ path: String) -> Bool {
    func empty(_ fd: Int32, depth: Int) -> Bool {
        guard depth < 64, let dir = fdopendir(fd) else {
            close(fd)
            return false
        }
        defer { closedir(dir) }
        var ok = true
        while let entry = readdir(dir) {
            let name = withDirectoryEntryName(entry) { String(decoding: $0, as: UTF8.self) }
            if name == "." || name == ".." { continue }
            let parent = dirfd(dir)
            if unlinkat(parent, name, 0) == 0 { continue }
            guard errno == EISDIR else {
                ok = false
                continue
            }
            let child = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            if child >= 0 { fchmod(child, 0o700) }
            if child < 0 || !empty(child, depth: depth + 1) || unlinkat(parent, name, AT_REMOVEDIR) != 0 { ok = false }
        }
        return ok
    }
    let fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
    guard fd >= 0 else { return errno == ENOENT }
    // A folder the worker made read-only still empties: its owner may write it after a chmod.
    fchmod(fd, 0o700)
    return empty(fd, depth: 0) && rmdir(path) == 0
}
