// Sandbox, host side: the profile each worker is launched under (README "Sandbox", shared/DESIGN.md "Sandbox").
//
// The host does not confine anything itself: it spawns `sdk-host-launcher` in the worker's place with the
// profile on descriptor 4, and the launcher applies the layers and execs the extension. Here the host works out
// what the profile holds: the extension's executable and, for a dynamically linked one, its loader and the
// libraries it needs (read from the ELF file, so the worker can read those and nothing else of /usr); the
// manifest's paths; and a private temp folder, made before the spawn and removed once the worker has exited.

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

/// What every worker may read besides its own files: random and zero devices, the CPU count (sysconf), the
/// time zone, and /proc. Dispatch reads /proc/<thread>/stat and crashes when it cannot, so /proc stays
/// readable; what matters in it is another process's environment, memory, maps and descriptors, and Landlock
/// refuses those for every process outside the worker's domain (they need ptrace access).
let runtimeReadablePaths = ["/dev/urandom", "/dev/random", "/dev/zero", "/sys/devices/system/cpu", "/etc/localtime", "/proc"]

/// Descriptors a worker may have open at once (RLIMIT_NOFILE).
let workerDescriptorLimit = 1024

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
        runtimePaths: RuntimePaths, temporaryBase: String, premadeDirectory: String? = nil
    ) throws(HostError) -> SandboxedSpawn {
        let policy = manifest.policy
        guard let launcher else {
            guard policy.sandbox == .none else {
                throw HostError(.system, "sandbox: launcher unavailable: \(launcherExecutableName) not found next to "
                    + "the host executable or in the executable search paths")
            }
            if let premadeDirectory { removeTree(premadeDirectory) }
            return SandboxedSpawn(request: SpawnRequest(path: path, arguments: [path], environment: environment))
        }
        let temporary: String
        if let premadeDirectory { temporary = premadeDirectory } else { temporary = try makeWorkerDirectory(in: temporaryBase) }
        var env = environment.filter { !$0.hasPrefix("TMPDIR=") }
        env.append("TMPDIR=\(temporary)")
        var profile: [String: PlistValue] = [
            "Extension": .string(manifest.identifier),
            "Executable": .string(path),
            "Arguments": .array([.string(path)]),
            "Environment": .array(env.map(PlistValue.string)),
            "HostPID": .integer(Int64(getpid())),
            "Sandbox": .string(policy.sandbox.rawValue),
            "NetworkAllowed": .bool(policy.networkAllowed),
            "AllowSubprocesses": .bool(policy.allowSubprocesses),
            "DescriptorLimit": .integer(Int64(workerDescriptorLimit)),
            "ExecutablePaths": .array(([path] + runtimePaths.executable).map(PlistValue.string)),
            "ReadablePaths": .array((runtimeReadablePaths + runtimePaths.readable + policy.readablePaths)
                .map(PlistValue.string)),
            "WritablePaths": .array((["/dev/null", temporary] + policy.writablePaths).map(PlistValue.string)),
        ]
        if let mb = policy.memoryLimitMB { profile["MemoryLimitMB"] = .integer(Int64(mb)) }
        var bytes: [UInt8] = []
        var encoder = BinaryPlistEncoder()
        encoder.encode(.dictionary(profile), appendingTo: &bytes)
        guard bytes.count <= SpawnRequest.maxProfileBytes else {
            removeTree(temporary)
            throw HostError(.invalidManifest, "\(manifest.manifestPath): the sandbox profile is \(bytes.count) bytes, "
                + "over \(SpawnRequest.maxProfileBytes): ReadablePaths or WritablePaths are too long")
        }
        return SandboxedSpawn(
            request: SpawnRequest(path: launcher, arguments: [launcherExecutableName, manifest.identifier],
                                  environment: [], profile: bytes),
            temporaryDirectory: temporary)
    }

    /// Finds the launcher: `configured`, else next to the running executable, else in `searchPaths`.
    package static func findLauncher(configured: String?, searchPaths: [String]) -> String? {
        if let configured { return access(configured, X_OK) == 0 ? configured : nil }
        let folders = [currentExecutableDirectory()].compactMap { $0 } + searchPaths
        return folders.lazy.map { "\($0)/\(launcherExecutableName)" }.first { access($0, X_OK) == 0 }
    }

    /// A new folder `<base>/sdk-host-worker.XXXXXX`, mode 0700.
    static let workerDirectoryPrefix = "sdk-host-worker."

    /// A private folder for one worker, named `sdk-host-worker.<host pid>.XXXXXX` so that a later host can tell
    /// whose it was (`removeOrphanedWorkerDirectories`).
    static func makeWorkerDirectory(in base: String) throws(HostError) -> String {
        var template = Array("\(base)/\(workerDirectoryPrefix)\(getpid()).XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) != nil }
        guard made else {
            throw HostError(.system, "cannot make a temp folder in \(base): \(SystemError("mkdtemp", errno: errno))")
        }
        return String(decoding: template.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The temporary folders this process has swept (`removeOrphanedWorkerDirectoriesOnce`).
    private static let swept = Mutex<Set<String>>([])

    /// `removeOrphanedWorkerDirectories`, the first time a host of this process uses `base`: orphans are left by
    /// hosts of other processes, so one sweep per process finds them, and an app that makes many hosts does not
    /// read a large temporary folder again for each (the read competed with the new host's first spawn).
    static func removeOrphanedWorkerDirectoriesOnce(in base: String) {
        guard swept.withLock({ $0.insert(base).inserted }) else { return }
        removeOrphanedWorkerDirectories(in: base)
    }

    /// A host killed with SIGKILL cannot remove its workers' folders (the workers die with it). The next host
    /// removes the folders in `base` whose host pid no longer exists, if they are real folders owned by this
    /// user; another user's, or a live host's, are never touched. Returns how many it removed.
    @discardableResult
    static func removeOrphanedWorkerDirectories(in base: String) -> Int {
        var removed = 0
        for name in listDirectory(base, prefix: workerDirectoryPrefix) ?? [] {
            let fields = name.dropFirst(workerDirectoryPrefix.count).split(separator: ".", maxSplits: 1)
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

/// What a dynamically linked executable needs besides itself: its loader and libraries (read and execute),
/// and the loader's cache (read). Empty for a static executable.
struct RuntimePaths: Sendable, Equatable {
    var executable: [String] = []
    var readable: [String] = []

    /// Reads `path`'s ELF program headers: PT_INTERP names the loader, the dynamic section's DT_NEEDED
    /// entries the libraries, found the way the loader finds them (RPATH or RUNPATH with $ORIGIN, then the
    /// system folders), recursively. An unreadable or non-ELF file needs nothing (the exec will say why).
    static func of(_ path: String) -> RuntimePaths {
        guard let image = ELFImage(path: path), let interpreter = image.interpreter else { return RuntimePaths() }
        var found: [String] = [interpreter]
        var seen: Set<String> = [interpreter]
        var pending: [(ELFImage, String)] = [(image, path)]
        while let (object, objectPath) = pending.popLast(), found.count < 512 {
            let origin = directory(of: objectPath)
            let paths = (object.runpath.isEmpty ? object.rpath : object.runpath).map {
                expandingOrigin($0, origin)
            }
            for name in object.needed {
                let candidates = name.contains("/") ? [name] : (paths + systemLibraryFolders).map { "\($0)/\(name)" }
                guard let library = candidates.first(where: { access($0, R_OK) == 0 }), seen.insert(library).inserted
                else { continue }
                found.append(library)
                if let dependency = ELFImage(path: library) { pending.append((dependency, library)) }
            }
        }
        return RuntimePaths(executable: found, readable: ["/etc/ld.so.cache"])
    }

    /// `$ORIGIN` and `${ORIGIN}` in a search path, replaced by the object's folder.
    static func expandingOrigin(_ entry: String, _ origin: String) -> String {
        var out = entry
        for token in ["${ORIGIN}", "$ORIGIN"] {
            var pieces: [Substring] = []
            var rest = Substring(out)
            while let range = rest.firstRange(of: token) {
                pieces.append(rest[..<range.lowerBound])
                rest = rest[range.upperBound...]
            }
            pieces.append(rest)
            out = pieces.joined(separator: origin)
        }
        return out
    }

    static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    #if arch(x86_64)
    static let multiarch = "x86_64-linux-gnu"
    #else
    static let multiarch = "aarch64-linux-gnu"
    #endif
    static let systemLibraryFolders = [
        "/usr/local/lib", "/lib/\(multiarch)", "/usr/lib/\(multiarch)", "/lib64", "/usr/lib64", "/lib", "/usr/lib",
    ]
}

/// The parts of a 64-bit little-endian ELF file the runtime paths need, read with pread.
struct ELFImage {
    var interpreter: String?
    var needed: [String] = []
    var rpath: [String] = []
    var runpath: [String] = []

    init?(path: String) {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        func bytes(_ offset: UInt64, _ count: Int) -> [UInt8]? {
            guard count > 0, count <= 1 << 20, offset < UInt64(Int64.max) else { return nil }
            var out = [UInt8](repeating: 0, count: count)
            let n = out.withUnsafeMutableBytes { pread(fd, $0.baseAddress, count, off_t(offset)) }
            return n == count ? out : nil
        }
        func u16(_ b: [UInt8], _ at: Int) -> Int { Int(b[at]) | Int(b[at + 1]) << 8 }
        func u64(_ b: [UInt8], _ at: Int) -> UInt64 { (0..<8).reduce(0) { $0 | UInt64(b[at + $1]) << (8 * $1) } }
        func string(_ offset: UInt64) -> String? {
            guard let raw = bytes(offset, 4096) ?? bytes(offset, 256) else { return nil }
            guard let end = raw.firstIndex(of: 0) else { return nil }
            return String(decoding: raw[..<end], as: UTF8.self)
        }
        // e_ident: magic, ELFCLASS64, ELFDATA2LSB.
        guard let header = bytes(0, 64), header[0..<4] == [0x7F, 0x45, 0x4C, 0x46], header[4] == 2, header[5] == 1
        else { return nil }
        let phoff = u64(header, 0x20), phentsize = u16(header, 0x36), phnum = u16(header, 0x38)
        guard phentsize >= 56, phnum > 0, let table = bytes(phoff, phentsize * phnum) else { return nil }
        var loads: [(offset: UInt64, vaddr: UInt64, size: UInt64)] = []
        var dynamic: (offset: UInt64, size: UInt64)?
        for i in 0..<phnum {
            let at = i * phentsize
            let type = u64(table, at) & 0xFFFF_FFFF
            let offset = u64(table, at + 8), vaddr = u64(table, at + 16), fileSize = u64(table, at + 32)
            switch type {
            case 1: loads.append((offset, vaddr, fileSize))
            case 2: dynamic = (offset, fileSize)
            case 3: interpreter = string(offset)
            default: break
            }
        }
        guard let dynamic, dynamic.size >= 16, dynamic.size < 1 << 20, let entries = bytes(dynamic.offset, Int(dynamic.size))
        else { return }
        var strtab: UInt64?
        var neededOffsets: [UInt64] = [], rpathOffset: UInt64?, runpathOffset: UInt64?
        for i in stride(from: 0, to: entries.count - 15, by: 16) {
            let tag = u64(entries, i), value = u64(entries, i + 8)
            switch tag {
            case 0: break
            case 1: neededOffsets.append(value)
            case 5: strtab = value
            case 15: rpathOffset = value
            case 29: runpathOffset = value
            default: continue
            }
            if tag == 0 { break }
        }
        // DT_STRTAB is an address: map it to a file offset through the PT_LOAD segment that holds it.
        guard let strtab, let segment = loads.first(where: { strtab >= $0.vaddr && strtab - $0.vaddr < $0.size })
        else { return }
        let base = segment.offset + (strtab - segment.vaddr)
        needed = neededOffsets.compactMap { string(base + $0) }
        rpath = rpathOffset.flatMap { string(base + $0) }.map { $0.split(separator: ":").map(String.init) } ?? []
        runpath = runpathOffset.flatMap { string(base + $0) }.map { $0.split(separator: ":").map(String.init) } ?? []
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
