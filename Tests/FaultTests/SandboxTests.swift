// The sandbox, attacked: Escaper (a real, dynamically linked extension process) tries each escape under the
// default profile and must be refused; the controls (threads, /dev/urandom, TMPDIR, a ReadablePaths entry,
// NetworkAllowed, AllowSubprocesses) must still work. Every target is the test's own: a folder it made, a
// listener it opened on 127.0.0.1 or in its folder, its own pid (signal 0, ptrace seize and detach).
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A folder of the test's own, with a secret file, a folder to mount over, and listeners the probes aim at.
final class ProbeTargets: @unchecked Sendable {
    let folder: String
    let tcpPort: UInt16
    let udpPort: UInt16
    let abstractName: String
    private var descriptors: [Int32] = []

    init() throws {
        var template = "/tmp/sdkhost-sandbox-XXXXXX".utf8CString
        folder = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        chmod(folder, 0o755)
        writeFile("\(folder)/secret", "the test's secret\n")
        mkdir("\(folder)/mountpoint", 0o755)
        abstractName = "sdkhost-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        var tcp: UInt16 = 0, udp: UInt16 = 0
        descriptors.append(try Self.inetListener(SOCK_STREAM, port: &tcp))
        descriptors.append(try Self.inetListener(SOCK_DGRAM, port: &udp))
        tcpPort = tcp
        udpPort = udp
        descriptors.append(try Self.unixListener("\(folder)/socket", abstract: false))
        descriptors.append(try Self.unixListener(abstractName, abstract: true))
        descriptors.append(try Self.datagramListener("\(folder)/dgram"))
    }

    /// A named datagram socket in the test's folder, for the probes that try to send to one.
    static func datagramListener(_ path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, b) in path.utf8.enumerated() { raw[i] = b }
        }
        let ok = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0 }
        }
        try #require(fd >= 0 && ok)
        return fd
    }

    func remove() {
        for fd in descriptors { close(fd) }
        for name in ["secret", "socket", "created", "lock", "dgram"] { unlink("\(folder)/\(name)") }
        rmdir("\(folder)/mountpoint")
        rmdir(folder)
    }

    static func inetListener(_ type: __socket_type, port: inout UInt16) throws -> Int32 {
        let fd = socket(AF_INET, Int32(type.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0
            }
        }
        try #require(fd >= 0 && bound)
        if type == SOCK_STREAM { try #require(listen(fd, 8) == 0) }
        port = UInt16(bigEndian: address.sin_port)
        return fd
    }

    static func unixListener(_ name: String, abstract: Bool) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(name.utf8)
        let offset = abstract ? 1 : 0
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, b) in bytes.enumerated() { raw[i + offset] = b }
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + offset + (abstract ? 0 : 1))
        let ok = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 }
        }
        try #require(fd >= 0 && ok && listen(fd, 8) == 0)
        return fd
    }

    /// Every escape DESIGN lists, aimed at this folder and these listeners.
    var escapes: [String] {
        let me = getpid()
        return [
            "read:\(folder)/secret", "read:/etc/shadow", "create:\(folder)/created",
            "tcp:\(tcpPort)", "udp:\(udpPort)", "netlink", "unix:\(folder)/socket", "abstract:\(abstractName)",
            "signal:\(me)", "ptrace:\(me)", "procmem:\(me)", "environ:\(me)",
            "userns", "netns", "mount:\(folder)/mountpoint", "io_uring", "userfaultfd", "bpf", "perf", "add_key",
            "fork", "clone3", "exec:/bin/true", "execself", "memory:anonymous", "memory:shared:4096", "memory:memfd:4096",
            "rlimit", "orphan:\(folder)/lock",
            // Files outside every grant: not even there to change, stat or watch.
            "chmod:\(folder)/secret", "utime:\(folder)/secret", "xattr:\(folder)/secret", "stat:\(folder)/secret",
            "inotify:\(folder)", "list:/", "list:/dev",
            // Other processes: not in the worker's pid namespace.
            "prlimit:\(me)", "renice:\(me)", "affinity:\(me)", "cmdline:\(me)", "prlimit:1", "signal:1",
            // Pid 1 shares the launcher's memory (CLONE_VM): the worker may not open it, read its environment or
            // trace it.
            "procmem:1", "environ:1", "ptrace:1",
            // The machine, read through /proc: its sockets, mounts and processes.
            "sees:/proc/net/unix=\(folder)/socket", "sees:/proc/1/mountinfo=\(folder)", "sees:/proc/self/mountinfo=\(folder)",
            "sees:/proc/1/net/unix=\(folder)/socket",
            // New code, and datagrams with an address.
            "memfdexec", "dgram:\(folder)/dgram", "dgrampair:\(folder)/dgram",
            // Limits that limit: threads (TMPDIR's TempSizeMB: manifestKeysOpenExactlyWhatTheyName).
            "manythreads:2000",
        ]
    }
}

/// Sends `attempt` to `ext` and returns the reply's title, or a description of how the request ended.
func probe(_ ext: Extension, _ recorder: Recorder, _ attempt: String) async -> String {
    let id = ext.beginRequest(withInputItems: [ExtensionItem(title: attempt)], deadline: 60)
    switch await recorder.wait(for: id, timeout: 90) {
    case .completed(let items)?: return items.first?.title ?? "no item"
    case let other?: return "ended: \(other)"
    case nil: return "no outcome"
    }
}

extension FaultTests {
    @Suite(.serialized) struct Sandbox {
        @Test func everyEscapeIsRefusedUnderTheDefaultProfile() async throws {
            let targets = try ProbeTargets()
            defer { targets.remove() }
            try await withHost { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.escaper")
                for attempt in targets.escapes {
                    let result = await probe(ext, recorder, attempt)
                    #expect(result.hasPrefix("refused"), "\(attempt): \(result)")
                }
                // The host kept serving throughout, and nothing reached the test's listeners or files.
                #expect(await probe(ext, recorder, "urandom").hasPrefix("allowed"))
                #expect(access("\(targets.folder)/created", F_OK) != 0)
            }
        }

        @Test func theWorkerRunsUnderEveryLayerAndTheControlsWork() async throws {
            try await withHost { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.escaper")
                let layers = await probe(ext, recorder, "layers")
                // From inside: seccomp filter mode, no_new_privs, no effective capabilities, the host its parent.
                #expect(layers.contains("seccomp 2") && layers.contains("nnp 1") && layers.contains("capeff 0000000000000000"),
                        "\(layers)")
                // Pid 2 of a pid namespace of its own (pid 1 is its launcher's init): no other process can be named.
                #expect(layers.contains("pid 2 ppid 0"), "\(layers)")
                for control in ["threads", "urandom", "timer"] {
                    let result = await probe(ext, recorder, control)
                    #expect(result.hasPrefix("allowed"), "\(control): \(result)")
                }
                // TMPDIR is a tmpfs of the worker's own, at /tmp in its root, of TempSizeMB (64 by default).
                let tmp = await probe(ext, recorder, "tmpdir")
                #expect(tmp == "allowed: wrote /tmp/probe", "\(tmp)")
                let size = await probe(ext, recorder, "tmpsize")
                #expect(size == "allowed: TMPDIR holds 64 MiB", "\(size)")
                // Its /dev holds the four nodes and nothing else (seen from the host), and nothing can be added.
                #expect(await probe(ext, recorder, "create:/dev/extra").hasPrefix("refused"))
                let (_, _, workers) = await host.inspect()
                let snapshot = try #require(workers.first)
                for layer in ["userNamespace", "pidNamespace", "mount, IPC, UTS and network namespaces", "root", "workerUser",
                              "seccomp"] {
                    #expect(snapshot.sandbox.contains(layer), "\(layer): \(snapshot.sandbox)")
                }
                #expect(snapshot.sandbox.contains { $0.hasPrefix("landlock:") }, "\(snapshot.sandbox)")
                // The pid the host reports is the process that runs the extension (the launcher's child).
                #expect(readLink("/proc/\(snapshot.pid)/exe")?.hasSuffix("/Escaper") == true)
                #expect(listDirectory("/proc/\(snapshot.pid)/root/dev")?.sorted() == ["null", "random", "urandom", "zero"])
                if getuid() == 0 {
                    // A root host's worker runs as WorkerUser (nobody), never as root.
                    let status = (try? readFile("/proc/\(snapshot.pid)/status")).map { String(decoding: $0, as: UTF8.self) } ?? ""
                    #expect(status.contains("Uid:\t65534\t65534\t65534\t65534"), "\(status)")
                }
            }
        }

        /// A launcher killed at any moment of a spawn (before, while and after it makes the namespaces and their
        /// pid 1) leaves nothing behind: pid 1 and the worker die with it, whenever it died.
        @Test func aLauncherKilledMidSpawnLeavesNoProcessBehind() async throws {
            let directory = try #require(currentExecutableDirectory())
            let marker = "com.example.killed-launcher-\(getpid())"
            var profile: [String: PlistValue] = [
                "Extension": .string(marker), "Executable": .string("\(directory)/Echo"),
                "Arguments": .array([.string("\(directory)/Echo")]), "Environment": .array([]),
                "HostPID": .integer(Int64(getpid())), "Sandbox": .string("strict"),
                "RuntimePaths": .array(HostConfiguration.defaultRuntimePaths.map(PlistValue.string)),
            ]
            profile["ExecutablePaths"] = profile["RuntimePaths"]
            var bytes: [UInt8] = []
            var encoder = BinaryPlistEncoder()
            encoder.encode(.dictionary(profile), appendingTo: &bytes)
            for round in 0..<40 {
                let channels = try spawnWithChannels(SpawnRequest(
                    path: "\(directory)/sdk-host-launcher", arguments: ["sdk-host-launcher", marker], environment: [],
                    profile: bytes))
                usleep(UInt32(round % 10) * 150)  // 0 to 1.35 ms: every step of the launch gets hit
                channels.terminate(signal: SIGKILL)
            }
            func survivors() -> [String] {
                (listDirectory("/proc", prefix: "") ?? []).filter { name in
                    guard Int32(name) != nil, let raw = try? readFile("/proc/\(name)/cmdline") else { return false }
                    return String(decoding: raw, as: UTF8.self).contains(marker)
                }
            }
            #expect(await eventually(timeout: 10) { survivors().isEmpty }, "left running: \(survivors())")
        }

        /// The launcher links no C library (its own runtime.c: entry, system calls, formatting, error texts), so
        /// its refusals are checked here as the host and an operator see them: the status, the stderr line, and
        /// the `launchFailed` frame.
        @Test func theLauncherExplainsABadProfileAndAMissingExecutable() throws {
            let launcher = "\(try #require(currentExecutableDirectory()))/sdk-host-launcher"
            func launch(_ changes: [String: PlistValue]) throws -> (SDKPosix.ExitStatus?, String, String) {
                var profile: [String: PlistValue] = [
                    "Extension": .string("com.example.test"), "Executable": .string("/nonexistent/worker"),
                    "Arguments": .array([.string("/nonexistent/worker")]), "Environment": .array([]),
                    "HostPID": .integer(Int64(getpid())), "Sandbox": .string("none"),
                ]
                profile.merge(changes) { $1 }
                var bytes: [UInt8] = []
                var encoder = BinaryPlistEncoder()
                encoder.encode(.dictionary(profile), appendingTo: &bytes)
                let channels = try spawnWithChannels(SpawnRequest(
                    path: launcher, arguments: ["sdk-host-launcher", "com.example.test"], environment: [], profile: bytes))
                let status = try? waitForExit(channels.process)
                func drain(_ fd: Int32) -> String {
                    var buffer = [UInt8](repeating: 0, count: 8192)
                    let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                    return String(decoding: buffer.prefix(max(n, 0)), as: UTF8.self)
                }
                let output = (status, drain(channels.stderr.rawValue), drain(channels.socket.rawValue))
                channels.close()
                return output
            }
            let (badStatus, badLine, badFrame) = try launch(["Sandbox": .string("sloppy")])
            #expect(badStatus == .exited(125))
            #expect(badLine == "sdk-host-launcher: com.example.test: profile: Sandbox 'sloppy' is not strict, bestEffort or none\n",
                    "\(badLine)")
            #expect(badFrame.contains("launchFailed") && badFrame.contains("Sandbox 'sloppy' is not strict"), "\(badFrame)")
            let (missingStatus, missingLine, _) = try launch([:])
            #expect(missingStatus == .exited(125))
            #expect(missingLine.contains("cannot exec /nonexistent/worker: No such file or directory"), "\(missingLine)")
            let (typeStatus, typeLine, _) = try launch(["MemoryLimitMB": .string("lots")])
            #expect(typeStatus == .exited(125))
            #expect(typeLine.contains("profile: MemoryLimitMB must be an integer or boolean"), "\(typeLine)")
        }

        @Test func aNewHostRemovesTheWorkerFoldersOfAHostThatWasKilled() async throws {
            var template = "/tmp/sdkhost-orphans-XXXXXX".utf8CString
            let base = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
            defer { _ = removeTree(base) }
            // A pid that is certainly gone: a child that has exited and been reaped.
            var dead: pid_t = 0
            var argv: [UnsafeMutablePointer<CChar>?] = [strdup("/bin/true"), nil]
            defer { free(argv[0]) }
            #expect(posix_spawn(&dead, "/bin/true", nil, nil, &argv, nil) == 0)
            var status: Int32 = 0
            waitpid(dead, &status, 0)
            let orphan = "\(base)/sdk-host-worker.\(dead).AbCdEf"
            let live = "\(base)/sdk-host-worker.1.GhIjKl"  // pid 1 is alive: a running host's folder
            let foreign = "\(base)/sdk-host-worker.\(dead).MnOpQr"
            let plainFile = "\(base)/sdk-host-worker.\(dead).StUvWx"
            for folder in [orphan, live, foreign] { mkdir(folder, 0o700) }
            mkdir("\(orphan)/nested", 0o700)
            writeFile("\(orphan)/nested/left-by-the-worker", "x")
            writeFile(plainFile, "not a folder")
            let root = getuid() == 0
            if root { chown(foreign, 65534, 65534) }  // another user's: never ours to remove
            try await withHost({ $0.temporaryDirectory = base }) { _, _ in
                #expect(await eventually { access(orphan, F_OK) != 0 }, "the killed host's worker folder is removed")
                #expect(access(live, F_OK) == 0, "a live host's folder is kept")
                #expect(access(plainFile, F_OK) == 0, "only folders are removed")
                if root { #expect(access(foreign, F_OK) == 0, "another user's folder is kept") }
            }
        }

        @Test func theNextWorkersFolderIsMadeAheadAndNothingIsLeftAfterShutdown() async throws {
            // Kept alive to the last line by folders(), which reads it after the host has shut down.
            let base = try TemporaryFolder("sdkhost-spare")
            func folders() -> [String] { listDirectory(base.path, prefix: "sdk-host-worker.\(getpid()).")?.sorted() ?? [] }
            // Under strict a worker's TMPDIR is its root's own tmpfs: the host makes no folder at all.
            try await withHost({ $0.temporaryDirectory = base.path }) { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.escaper")
                #expect(await probe(ext, recorder, "tmpdir") == "allowed: wrote /tmp/probe")
                #expect(folders().isEmpty, "\(folders())")
            }
            // bestEffort may run without a root of its own: its workers get a folder, the next one made ahead.
            let loose = TemporaryExtension(identifier: "com.example.escaper-loose", executable: "Escaper",
                                           policy: "<key>Sandbox</key><string>bestEffort</string>")
            defer { loose.remove() }
            try await withHost(extraSearchPaths: [loose.root], { $0.temporaryDirectory = base.path }) { host, _ in
                // Made when the host starts, before any request.
                #expect(await eventually { folders().count == 1 }, "\(folders())")
                let spare = try #require(folders().first)
                let (ext, recorder) = try recordedExtension(host, loose.identifier)
                let tmp = await probe(ext, recorder, "tmpdir")
                // Its TMPDIR is its root's own tmpfs where the kernel allows one; the first worker still took that
                // folder, and the next one is ready beside it.
                #expect(tmp == "allowed: wrote /tmp/probe", "\(tmp)")
                #expect(await eventually { folders().count == 2 && folders().contains(spare) }, "\(folders())")
            }
            #expect(folders().isEmpty, "left behind: \(folders())")
        }

        /// A root host's strict worker's root is a read-only clone of a template that holds only its mount points,
        /// built by the first worker that needs it and used again by the next host. Nothing the worker does
        /// reaches the template; one found damaged is set aside and built again.
        @Test(.enabled(if: geteuid() == 0, "root templates are a root host's"))
        func theRootIsAReadOnlyCloneOfATemplateOfItsMountPoints() async throws {
            let base = try TemporaryFolder("sdkhost-templates")
            let folder = "\(base.path)/sdk-host-roots.0"
            func templates() -> [String] { listDirectory(folder)?.sorted() ?? [] }
            var seen: [String]?
            try await withHost({ $0.temporaryDirectory = base.path }) { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.escaper")
                #expect(await probe(ext, recorder, "tmpdir") == "allowed: wrote /tmp/probe")
                for attempt in ["create:/by-the-worker", "create:/usr/by-the-worker", "chmod:/usr", "utime:/usr", "xattr:/usr"] {
                    let result = await probe(ext, recorder, attempt)
                    #expect(result.hasPrefix("refused"), "\(attempt): \(result)")
                }
                let snapshot = try #require(await host.inspect().2.first)
                #expect(snapshot.sandbox.contains("root"), "\(snapshot.sandbox)")
                if geteuid() == 0 {
                    seen = listDirectory("/proc/\(snapshot.pid)/root")?.sorted()
                    // Its root is mounted read-only (the clone was made so), whatever else the layers refuse.
                    let mounts = String(decoding: (try? readFile("/proc/\(snapshot.pid)/mountinfo")) ?? [], as: UTF8.self)
                    let root = mounts.split(separator: "\n").map { $0.split(separator: " ") }.first { $0.count > 5 && $0[4] == "/" }
                    #expect(root.map { $0[5].split(separator: ",").contains("ro") } == true, "\(mounts)")
                }
            }
            let made = templates()
            #expect(made.count == 1 && made.first?.count == 64, "\(made)")
            var info = stat()
            #expect(lstat(folder, &info) == 0 && info.st_mode & 0o777 == 0o700)
            let template = "\(folder)/\(made.first ?? "")"
            // What the worker saw as its root is the template; the machine's runtime folders are empty mount points
            // in it, and it holds no file with anything in it.
            if let seen { #expect(listDirectory(template)?.sorted() == seen, "\(seen)") }
            #expect(listDirectory(template)?.contains("tmp") == true && listDirectory(template)?.contains("proc") == true)
            #expect(listDirectory("\(template)/usr/lib")?.isEmpty == true)
            func filesWithBytes(_ path: String, depth: Int = 0) -> [String] {
                var info = stat()
                guard depth < 40, lstat(path, &info) == 0 else { return [] }
                if info.st_mode & S_IFMT == S_IFREG { return info.st_size > 0 ? [path] : [] }
                guard info.st_mode & S_IFMT == S_IFDIR else { return [] }
                return (listDirectory(path) ?? []).flatMap { filesWithBytes("\(path)/\($0)", depth: depth + 1) }
            }
            #expect(filesWithBytes(template).isEmpty, "\(filesWithBytes(template))")
            #expect(access("\(template)/by-the-worker", F_OK) != 0 && access("\(template)/usr/by-the-worker", F_OK) != 0)
            #expect(lstat("\(template)/usr", &info) == 0 && info.st_mode & 0o7777 == 0o755)
            // The next host's worker uses it as it is: no other template, none half-built.
            try await withHost({ $0.temporaryDirectory = base.path }) { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.escaper")
                #expect(await probe(ext, recorder, "tmpdir") == "allowed: wrote /tmp/probe")
            }
            #expect(templates() == made, "\(templates())")
            // Damaged (a cleaner of old temporary files took a mount point away): the next launch sets it aside,
            // builds it again, and runs.
            #expect(rmdir("\(template)/usr/lib") == 0)
            try await withHost({ $0.temporaryDirectory = base.path }) { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.escaper")
                #expect(await probe(ext, recorder, "tmpdir") == "allowed: wrote /tmp/probe")
                let snapshot = try #require(await host.inspect().2.first)
                #expect(snapshot.sandbox.contains("root"), "\(snapshot.sandbox)")
            }
            #expect(templates().filter { !$0.hasPrefix(".") } == made, "\(templates())")
            #expect(templates().filter { $0.hasPrefix(".damaged.") }.count == 1, "\(templates())")
            #expect(listDirectory("\(template)/usr/lib")?.isEmpty == true)
        }

        /// WritablePaths outside /tmp have their mount points in the template, read-write once bound; and a bestEffort
        /// worker whose host folder is under /dev/shm (inside the read-only /dev the root binds, where /dev/shm allows
        /// device nodes) still gets a root: there its TMPDIR is the root's own tmpfs, and the host's folder for it is
        /// not bound.
        @Test(.enabled(if: geteuid() == 0, "root templates are a root host's"))
        func grantsOutsideTheTemplatesPlacesStillLaunch() async throws {
            var template = "/var/tmp/sdkhost-writable-XXXXXX".utf8CString
            let writable = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
            defer { _ = removeTree(writable) }
            #expect(chown(writable, 65534, 65534) == 0)
            let strict = TemporaryExtension(identifier: "com.example.escaper-var-tmp", executable: "Escaper",
                                            policy: "<key>WritablePaths</key><array><string>\(writable)</string></array>")
            defer { strict.remove() }
            let base = try TemporaryFolder("sdkhost-templates-writable")
            try await withHost(extraSearchPaths: [strict.root], { $0.temporaryDirectory = base.path }) { host, _ in
                let (ext, recorder) = try recordedExtension(host, strict.identifier)
                let wrote = await probe(ext, recorder, "create:\(writable)/made")
                #expect(wrote == "allowed: created \(writable)/made", "\(wrote)")
            }
            // The template held the writable folder's mount point (an empty folder of root's).
            let made = listDirectory("\(base.path)/sdk-host-roots.0")?.filter { !$0.hasPrefix(".") } ?? []
            #expect(made.count == 1, "\(made)")
            #expect(listDirectory("\(base.path)/sdk-host-roots.0/\(made.first ?? "")\(writable)")?.isEmpty == true)

            let loose = TemporaryExtension(identifier: "com.example.escaper-loose-shm", executable: "Escaper",
                                           policy: "<key>Sandbox</key><string>bestEffort</string>")
            defer { loose.remove() }
            // Its templates go in /dev/shm/sdk-host-roots.0: removed afterwards unless it was there before.
            let shmTemplates = "/dev/shm/sdk-host-roots.0"
            let hadTemplates = access(shmTemplates, F_OK) == 0
            defer { if !hadTemplates { _ = removeTree(shmTemplates) } }
            try await withHost(extraSearchPaths: [loose.root], { $0.temporaryDirectory = "/dev/shm" }) { host, log in
                let (other, otherRecorder) = try recordedExtension(host, loose.identifier)
                #expect(await probe(other, otherRecorder, "tmpdir") == "allowed: wrote /tmp/probe")
                let worker = try #require(await host.inspect().2.first)
                #expect(worker.sandbox.contains("root"), "\(worker.sandbox) \(log.all)")
                // Where /dev/shm is nodev there is no folder of device nodes, and the case above is not the one meant.
                let devices = listDirectory("/dev/shm", prefix: "sdk-host-devices.\(getpid()).") ?? []
                if devices.isEmpty { print("note: /dev/shm holds no device folder here; the bestEffort half ran without one") }
            }
        }

        /// A grant under /dev still lands: the host's read-only folder of device nodes is then not bound as /dev
        /// (the four nodes are bound one by one), so that the grant's mount point can be made.
        @Test func aGrantUnderDevStillLaunches() async throws {
            var template = "/dev/shm/sdkhost-devgrant-XXXXXX".utf8CString
            let folder = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
            defer { _ = removeTree(folder) }
            #expect(chmod(folder, 0o755) == 0)
            writeFile("\(folder)/secret", "under /dev")
            #expect(chmod("\(folder)/secret", 0o644) == 0)
            let ext = TemporaryExtension(identifier: "com.example.escaper-dev-grant", executable: "Escaper",
                                         policy: "<key>ReadablePaths</key><array><string>\(folder)</string></array>")
            defer { ext.remove() }
            try await withHost(extraSearchPaths: [ext.root]) { host, log in
                let (escaper, recorder) = try recordedExtension(host, ext.identifier)
                let read = await probe(escaper, recorder, "read:\(folder)/secret")
                #expect(read == "allowed: read \(folder)/secret", "\(read) \(log.all)")
                #expect(await probe(escaper, recorder, "urandom").hasPrefix("allowed"))
            }
        }

        /// A templates folder someone else may write is never used: each root is made anew, as without one.
        @Test(.enabled(if: geteuid() == 0, "root templates are a root host's"))
        func aTemplatesFolderOthersMayWriteIsNotUsed() async throws {
            let base = try TemporaryFolder("sdkhost-templates-open")
            let folder = "\(base.path)/sdk-host-roots.0"
            #expect(mkdir(folder, 0o700) == 0 && chmod(folder, 0o777) == 0)
            try await withHost({ $0.temporaryDirectory = base.path }) { host, log in
                let (ext, recorder) = try recordedExtension(host, "com.example.escaper")
                #expect(await probe(ext, recorder, "tmpdir") == "allowed: wrote /tmp/probe")
                let snapshot = try #require(await host.inspect().2.first)
                #expect(snapshot.sandbox.contains("root"), "\(snapshot.sandbox)")
                #expect(log.contains("sdk-host-roots.\(geteuid()) for root templates"), "\(log.all)")
            }
            #expect(listDirectory(folder)?.isEmpty == true, "\(listDirectory(folder) ?? [])")
        }

        /// Launchers that start at once with no template yet each build one under a name of their own; one is
        /// renamed into place, the others are removed, and every launch succeeds. A folder others may write is
        /// not used, even when the host names it, nor is any by an unprivileged launcher (its worker has its uid).
        @Test(.enabled(if: geteuid() == 0, "root templates are a root host's"))
        func launchersBuildingTheSameTemplateAtOnceAllLaunchAndLeaveOne() async throws {
            let base = try TemporaryFolder("sdkhost-templates-race")
            let folder = "\(base.path)/sdk-host-roots.0"
            #expect(mkdir(folder, 0o700) == 0)
            let directory = try #require(currentExecutableDirectory())
            var profile: [String: PlistValue] = [
                "Extension": .string("com.example.echo"), "Executable": .string("\(directory)/Echo"),
                "Arguments": .array([.string("\(directory)/Echo")]), "Environment": .array([]),
                "HostPID": .integer(Int64(getpid())), "Sandbox": .string("strict"),
                "RuntimePaths": .array(HostConfiguration.defaultRuntimePaths.map(PlistValue.string)),
                "ReadablePaths": .array([.string("/etc/localtime")]), "RootTemplates": .string(folder),
                "ExecutablePaths": .array((["\(directory)/Echo"] + HostConfiguration.defaultRuntimePaths).map(PlistValue.string)),
            ]
            var bytes: [UInt8] = []
            var encoder = BinaryPlistEncoder()
            encoder.encode(.dictionary(profile), appendingTo: &bytes)
            // The launcher's first frame to the host: `sandboxed` (with its layers) once the worker is confined.
            func firstFrame(_ fd: Int32) -> String {
                var frame: [UInt8] = []
                for _ in 0..<30 where !String(decoding: frame, as: UTF8.self).contains("layers") {
                    var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                    guard poll(&pfd, 1, 1000) >= 0 else { break }
                    if pfd.revents == 0 { continue }
                    var chunk = [UInt8](repeating: 0, count: 4096)
                    let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                    if n <= 0 { break }
                    frame += chunk.prefix(n)
                }
                return String(decoding: frame, as: UTF8.self)
            }
            // All launched before any is read: each level starts one, then the rest, then reads its own.
            func launch(_ remaining: Int) throws -> [String] {
                guard remaining > 0 else { return [] }
                let channels = try spawnWithChannels(SpawnRequest(
                    path: "\(directory)/sdk-host-launcher", arguments: ["sdk-host-launcher", "com.example.echo"],
                    environment: [], profile: bytes))
                var frames = try launch(remaining - 1)
                frames.append(firstFrame(channels.socket.rawValue))
                channels.terminate(signal: SIGKILL)
                return frames
            }
            for frame in try launch(6) {
                #expect(frame.contains("sandboxed") && frame.contains("root"), "\(frame)")
            }
            #expect(listDirectory(folder)?.count == 1, "\(listDirectory(folder) ?? [])")
            #expect(listDirectory(folder)?.allSatisfy { $0.count == 64 } == true, "\(listDirectory(folder) ?? [])")
            // The launcher checks the folder itself: one that others may write is not used (nor written).
            let open = "\(base.path)/open"
            #expect(mkdir(open, 0o700) == 0 && chmod(open, 0o777) == 0)
            profile["RootTemplates"] = .string(open)
            bytes = []
            encoder.encode(.dictionary(profile), appendingTo: &bytes)
            for frame in try launch(1) {
                #expect(frame.contains("sandboxed") && frame.contains("root"), "\(frame)")
            }
            #expect(listDirectory(open)?.isEmpty == true, "\(listDirectory(open) ?? [])")
            // An unprivileged launcher (here nobody's, through setpriv) uses none, even in a folder of its own uid.
            let own = "\(base.path)/nobody"
            #expect(chmod(base.path, 0o755) == 0 && mkdir(own, 0o700) == 0 && chown(own, 65534, 65534) == 0)
            let copy = "\(base.path)/sdk-host-launcher"
            try writeFile(copy, try readFile("\(directory)/sdk-host-launcher"), mode: 0o755)
            profile["RootTemplates"] = .string(own)
            profile["Executable"] = .string("/bin/true")
            profile["Arguments"] = .array([.string("/bin/true")])
            bytes = []
            encoder.encode(.dictionary(profile), appendingTo: &bytes)
            let channels = try spawnWithChannels(SpawnRequest(
                path: "/usr/bin/setpriv", arguments: ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", copy, "x"],
                environment: [], profile: bytes))
            let frame = firstFrame(channels.socket.rawValue)
            channels.terminate(signal: SIGKILL)
            #expect(frame.contains("sandboxed") && frame.contains("root"), "\(frame)")
            #expect(listDirectory(own)?.isEmpty == true, "\(listDirectory(own) ?? [])")
        }

        /// A path granted twice (here /etc/localtime, which every worker reads already, and a file listed twice)
        /// is bound once and then found in place: the launcher does not try to make it again inside a read-only
        /// bind.
        @Test func aPathGrantedTwiceStillLaunches() async throws {
            let targets = try ProbeTargets()
            defer { targets.remove() }
            let twice = TemporaryExtension(identifier: "com.example.echo-twice", executable: "Echo", policy: """
                <key>ReadablePaths</key><array>
                  <string>/etc/localtime</string>
                  <string>\(targets.folder)/secret</string><string>\(targets.folder)/secret</string>
                </array>
                """)
            defer { twice.remove() }
            try await withHost(extraSearchPaths: [twice.root]) { host, log in
                let (ext, recorder) = try recordedExtension(host, twice.identifier)
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "twice")])
                #expect(await recorder.wait(for: id) == .completed([ExtensionItem(title: "twice")]),
                        "\(log.all.suffix(6).joined(separator: " | "))")
            }
        }

        @Test func manifestKeysOpenExactlyWhatTheyName() async throws {
            let targets = try ProbeTargets()
            defer { targets.remove() }
            let opened = TemporaryExtension(identifier: "com.example.escaper-open", executable: "Escaper", policy: """
                <key>NetworkAllowed</key><true/>
                <key>AllowSubprocesses</key><true/>
                <key>ReadablePaths</key><array><string>\(targets.folder)/secret</string></array>
                <key>WritablePaths</key><array><string>\(targets.folder)</string></array>
                <key>TempSizeMB</key><integer>2</integer>
                """)
            defer { opened.remove() }
            // A root host's workers run as WorkerUser (nobody): a WritablePaths folder must be theirs to write.
            if geteuid() == 0 { chown(targets.folder, 65534, 65534) }
            try await withHost(extraSearchPaths: [opened.root]) { host, _ in
                let ext = try host.extension(identifier: opened.identifier)
                let recorder = Recorder()
                recorder.attach(to: ext)
                for attempt in ["read:\(targets.folder)/secret", "tcp:\(targets.tcpPort)", "udp:\(targets.udpPort)",
                                "create:\(targets.folder)/created", "fork"] {
                    let result = await probe(ext, recorder, attempt)
                    #expect(result.hasPrefix("allowed"), "\(attempt): \(result)")
                }
                // TempSizeMB sizes TMPDIR, and a write past it stops there (a few MiB: memory-heavy probes stall on a
                // loaded VM past the heartbeat timeout).
                #expect(await probe(ext, recorder, "tmpsize") == "allowed: TMPDIR holds 2 MiB")
                let fill = await probe(ext, recorder, "tmpfill:8")
                #expect(fill.hasPrefix("refused: stopped at 2 MiB") || fill.hasPrefix("refused: stopped at 1 MiB"), "\(fill)")
                // Still refused: what the keys do not name.
                for attempt in ["read:/etc/shadow", "ptrace:\(getpid())", "signal:\(getpid())", "mount:\(targets.folder)/mountpoint",
                                "environ:\(getpid())", "exec:/bin/true"] {
                    let result = await probe(ext, recorder, attempt)
                    #expect(result.hasPrefix("refused"), "\(attempt): \(result)")
                }
                // Forking and exec'ing its own executable is allowed, and the exec gains no capability back, even
                // with a root host: no_new_privs and empty sets (and, as root, the locked securebits).
                let exec = await probe(ext, recorder, "execself")
                #expect(exec.hasPrefix("allowed: exec'd itself"), "\(exec)")
                for line in ["CapInh: 0000000000000000", "CapPrm: 0000000000000000", "CapEff: 0000000000000000",
                             "CapAmb: 0000000000000000", "NoNewPrivs: 1"] {
                    #expect(exec.contains(line), "\(line) after an exec: \(exec)")
                }
                // A grandchild in its own session dies with the worker: its lock on the file is released.
                try await expectOrphanDiesWithItsWorker(host, ext, recorder, lock: "\(targets.folder)/lock", layer: "pidNamespace")
            }
        }

        /// Without a pid namespace (`Sandbox none`) a grandchild in a session of its own still dies with its
        /// worker: the launcher stays as the worker's parent, a child subreaper, and kills what the worker left.
        /// Harmless when it does not: the test ends the survivor by the pid that holds the lock on its own file.
        @Test func underSandboxNoneAnOrphanStillDiesWithItsWorker() async throws {
            try await withUnsandboxedEscaper { host, ext, recorder, targets in
                try await expectOrphanDiesWithItsWorker(host, ext, recorder, lock: "\(targets.folder)/lock", layer: "subreaper")
            }
        }

        /// Under `Sandbox none` a worker, or what it left, can stop its launcher (they share a uid). A worker the
        /// host kills for a hang then, whose orphan holds its socket open, still ends: 3 s after the kill the host
        /// kills it again and continues the launcher, which kills the orphan and exits, and is reaped. Before, the
        /// request never ended and the launcher was never reaped. Harmless when that fails: the test ends the
        /// orphan by the pid that holds its lock and the launcher (its host's child) by pid.
        @Test func aHungWorkersStoppedLauncherIsContinuedAndReaped() async throws {
            try await withUnsandboxedEscaper({
                $0.heartbeatInterval = .seconds(0.1)
                $0.heartbeatTimeout = .seconds(0.5)
            }) { host, ext, recorder, targets in
                let lock = "\(targets.folder)/lock"
                let orphan = await probe(ext, recorder, "orphan:\(lock)")
                #expect(orphan.hasPrefix("allowed: an orphan holds"), "\(orphan)")
                let (_, _, workers) = await host.inspect()
                let worker = try #require(workers.first)
                let launcher = try #require(procStatFields("\(worker.pid)").flatMap { pid_t($0[1]) })
                #expect(launcher != getpid(), "the worker is its launcher's child")
                kill(launcher, SIGSTOP)
                // A request on that worker, then the worker stopped: hung, the host kills it.
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "sleep:60")], deadline: 120)
                #expect(await eventually { ext.pid(for: id) != nil })
                #expect(ext.pid(for: id) == worker.pid)
                kill(worker.pid, SIGSTOP)
                #expect(await recorder.wait(for: id, timeout: 40) == .interrupted(.hang))
                // Reaped by the host (gone from /proc, not a zombie), and the orphan gone with it.
                let reaped = await eventually(timeout: 30) { kill(launcher, 0) != 0 && errno == ESRCH }
                #expect(reaped, "the stopped launcher \(launcher) was never reaped")
                let released = await eventually { lockIsFree(lock) }
                #expect(released, "the orphan outlived its worker")
                if !released { for pid in lockHolders(lock) { kill(pid, SIGKILL) } }
                if !reaped { kill(launcher, SIGKILL) }
            }
        }

        /// A root host makes one empty network namespace for all its workers without NetworkAllowed (a namespace
        /// per worker cost a third of a cold start): two extensions' workers share it, it is not the host's, and a
        /// NetworkAllowed worker is in the host's. Nothing is reachable through it (the escape probes above).
        @Test(.enabled(if: geteuid() == 0, "a shared network namespace needs a root host"))
        func workersWithoutNetworkShareOneEmptyNetworkNamespace() async throws {
            let open = TemporaryExtension(identifier: "com.example.escaper-network", executable: "Escaper",
                                          policy: "<key>NetworkAllowed</key><true/>")
            defer { open.remove() }
            try await withHost(extraSearchPaths: [open.root]) { host, _ in
                func netns(_ identifier: String) async throws -> String {
                    let ext = try host.extension(identifier: identifier)
                    let task = ext.start([ExtensionItem(title: identifier == "com.example.crasher" ? "slow:1" : "urandom")])
                    _ = await task.outcome
                    let pid = try #require(task.pid)
                    return try #require(readLink("/proc/\(pid)/ns/net"))
                }
                let escaper = try await netns("com.example.escaper")
                let crasher = try await netns("com.example.crasher")
                let networked = try await netns("com.example.escaper-network")
                let own = try #require(readLink("/proc/self/ns/net"))
                #expect(escaper == crasher && escaper != own, "\(escaper) \(crasher) \(own)")
                #expect(networked == own, "\(networked) \(own)")
            }
        }

        @Test func aForbiddenArchitectureCallKillsWithSIGSYS() async throws {
            try await withHost { host, _ in
                let (ext, recorder) = try recordedExtension(host, "com.example.escaper")
                let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "x32")], deadline: 60)
                let outcome = await recorder.wait(for: id)
                #if arch(x86_64)
                #expect(outcome == .interrupted(.signal(SIGSYS)))
                #expect(InterruptionReason.signal(SIGSYS).description.contains("SIGSYS"))
                #endif
                #expect(await probe(ext, recorder, "urandom").hasPrefix("allowed"), "the next worker serves")
            }
        }

        @Test func badSandboxKeysAreClearErrors() async throws {
            let cases = [
                ("<key>Sandbox</key><string>loose</string>", "Sandbox: 'loose' is not one of strict, bestEffort, none"),
                ("<key>ReadablePaths</key><array><string>relative/path</string></array>", "ReadablePaths: 'relative/path'"),
                ("<key>WritablePaths</key><array><string>/tmp/../etc</string></array>", "WritablePaths: '/tmp/../etc'"),
                // The root is no grant: it was skipped at every launch with a warning that it was not found.
                ("<key>WritablePaths</key><array><string>/</string></array>", "WritablePaths: '/' is the whole file system"),
                ("<key>ReadablePaths</key><array><string>/tmp</string><string>/./</string></array>",
                 "ReadablePaths: '/./' is the whole file system"),
                ("<key>ReadablePaths</key><array><string>/proc/self/root</string></array>",
                 "ReadablePaths: '/proc/self/root' is the whole file system"),
                ("<key>AllowSubprocesses</key><string>yes</string>", "AllowSubprocesses"),
            ]
            expectManifestErrors(cases, executable: "Escaper")
        }
    }
}

/// Has `ext`'s worker leave a grandchild in a session of its own that holds a lock on `lock`, kills the worker,
/// and expects the grandchild to die with it (the lock released), the worker having run under `layer`. Harmless
/// when it does not: the survivor is ended by the pid that holds the lock.
func expectOrphanDiesWithItsWorker(_ host: ExtensionHost, _ ext: Extension, _ recorder: Recorder, lock: String, layer: String,
                                   sourceLocation: SourceLocation = #_sourceLocation) async throws
{
    let orphan = await probe(ext, recorder, "orphan:\(lock)")
    #expect(orphan.hasPrefix("allowed: an orphan holds"), "\(orphan)", sourceLocation: sourceLocation)
    let (_, _, workers) = await host.inspect()
    let worker = try #require(workers.first, sourceLocation: sourceLocation)
    #expect(worker.sandbox.contains(layer), "\(worker.sandbox)", sourceLocation: sourceLocation)
    kill(worker.pid, SIGKILL)
    let released = await eventually { lockIsFree(lock) }
    #expect(released, "the orphaned grandchild outlived its worker", sourceLocation: sourceLocation)
    if !released { for pid in lockHolders(lock) { kill(pid, SIGKILL) } }
}

/// Whether nobody holds a flock on `lock` (a test's own file).
func lockIsFree(_ lock: String) -> Bool {
    let fd = open(lock, O_WRONLY | O_CLOEXEC)
    defer { if fd >= 0 { close(fd) } }
    return fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0
}

/// Runs `body` with a host (`tweak` adds to its configuration) serving Escaper under `Sandbox none` with
/// AllowSubprocesses, a recorder attached to it, and probe targets of the test's own.
func withUnsandboxedEscaper(_ tweak: @escaping (inout HostConfiguration) -> Void = { _ in },
                            _ body: (ExtensionHost, Extension, Recorder, ProbeTargets) async throws -> Void) async throws
{
    let targets = try ProbeTargets()
    defer { targets.remove() }
    let loose = TemporaryExtension(identifier: "com.example.escaper-none", executable: "Escaper", policy: """
        <key>Sandbox</key><string>none</string>
        <key>AllowSubprocesses</key><true/>
        """)
    defer { loose.remove() }
    try await withHost(extraSearchPaths: [loose.root], {
        $0.allowedSandboxModes = [.strict, .bestEffort, .none]
        tweak(&$0)
    }) { host, _ in
        let ext = try host.extension(identifier: loose.identifier)
        let recorder = Recorder()
        recorder.attach(to: ext)
        try await body(host, ext, recorder, targets)
    }
}

/// The pids holding a flock on `path`, from /proc/locks (by the file's inode).
func lockHolders(_ path: String) -> [pid_t] {
    var st = stat()
    guard stat(path, &st) == 0, let text = readSmallFile("/proc/locks") else { return [] }
    return text.split(separator: "\n").compactMap { line -> pid_t? in
        let fields = line.split(separator: " ")
        guard fields.count >= 6, fields[1] == "FLOCK", fields[5].hasSuffix(":\(st.st_ino)") else { return nil }
        return pid_t(fields[4])
    }
}
