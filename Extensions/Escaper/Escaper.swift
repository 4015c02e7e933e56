// Escaper (com.example.escaper): a probe that tries to escape its sandbox. The first item's title picks one
// attempt, `name` or `name:argument`; the reply is one item titled "refused: <why>" or "allowed: <what>".
// The sandbox tests run every attempt under the default profile and expect "refused" (or, for the calls that
// seccomp answers with SIGSYS, the worker's death), and run the controls and expect "allowed".
//
// Every attempt is harmless if nothing stops it: files are made only at paths the test gives (inside its own
// folder) and removed at once, connections go to listeners the test opened on 127.0.0.1 or in its folder,
// signals are signal 0, ptrace seizes and detaches, a mount goes over the test's folder and is undone at once,
// and a memory bomb touches at most 64 MiB of what it mapped.
//
// Built the ordinary way (dynamically linked against the toolchain's Swift runtime), as an extension in
// another package would be, so that the default profile is shown to run one.
import Dispatch
import EscaperProbes
import SDKExtension

#if canImport(Glibc)
import Glibc
#endif

@main
struct Escaper: RequestHandler {
    func beginRequest(with context: ExtensionContext) {
        let title = context.inputItems.first?.title ?? ""
        let name = String(title.prefix { $0 != ":" })
        let argument = title.contains(":") ? String(title[title.index(after: title.firstIndex(of: ":")!)...]) : ""
        let file = context.inputItems.first?.fileAttachments.first
        let result = file.map { Attempts.withAttachment(name, $0) } ?? Attempts.run(name, argument)
        context.completeRequest(returningItems: [ExtensionItem(title: result)])
    }
}

enum Attempts {
    static func run(_ name: String, _ argument: String) -> String {
        switch name {
        case "read": return readFile(argument)
        case "create": return createFile(argument)
        case "tcp": return connectInet(port: argument, type: SOCK_STREAM)
        case "udp": return connectInet(port: argument, type: SOCK_DGRAM)
        case "netlink": return outcome(socket(AF_NETLINK, Int32(SOCK_RAW.rawValue), 0), "a netlink socket")
        case "unix": return connectUnix(argument, abstract: false)
        case "abstract": return connectUnix(argument, abstract: true)
        case "signal": return outcome(kill(pid_t(argument) ?? 0, 0), "signal 0 reached \(argument)")
        case "ptrace": return ptraceSeize(pid_t(argument) ?? 0)
        case "procmem":
            // Opening another process's memory is the escape (it needs ptrace access); a read at offset 0 fails
            // anyway, as nothing is mapped there.
            let fd = open("/proc/\(argument)/mem", O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { return "refused: \(describe(errno))" }
            close(fd)
            return "allowed: opened /proc/\(argument)/mem"
        case "environ": return readFile("/proc/\(argument)/environ")
        case "userns": return outcome(Int32(probe_unshare(0x1000_0000 /* CLONE_NEWUSER */)), "a new user namespace")
        case "netns": return outcome(Int32(probe_unshare(0x4000_0000 /* CLONE_NEWNET */)), "a new network namespace")
        case "mount": return mountOver(argument)
        case "io_uring": return ioUring()
        case "userfaultfd": return outcome(Int32(probe_userfaultfd()), "a userfaultfd")
        case "bpf": return outcome(Int32(probe_bpf_map()), "a BPF map")
        case "perf": return outcome(Int32(probe_perf_event()), "a perf event")
        case "add_key": return outcome(Int32(probe_add_key()), "a key in the process keyring", closing: false)
        case "clone3": return outcome(Int32(probe_clone3()), "a process from clone3", closing: false)
        case "fork": return forkChild()
        case "exec": return execProgram(argument)
        case "execself": return execSelf()
        case "memory": return memoryBomb(argument)
        case "rlimit": return raiseLimit()
        case "orphan": return orphan(argument)
        case "threads": return threads()
        case "urandom": return urandom()
        case "sleep":
            // Busy for a while (a test stops the worker or its launcher meanwhile).
            sleep(UInt32(argument) ?? 30)
            return "allowed: slept"
        case "tmpdir": return tmpdir()
        case "layers": return layers()
        case "timer": return timer()
        case "x32": return "refused: the call returned \(probe_x32())"
        case "memfdexec": return outcome(Int32(probe_memfd_exec()), "execveat of a memfd reached the loader", closing: false)
        case "prlimit": return outcome(Int32(probe_prlimit(pid_t(argument) ?? 0)), "read the limits of \(argument)", closing: false)
        case "renice": return outcome(Int32(probe_setpriority(pid_t(argument) ?? 0)), "set the priority of \(argument)", closing: false)
        case "affinity": return outcome(Int32(probe_affinity(pid_t(argument) ?? 0)), "set the affinity of \(argument)", closing: false)
        case "chmod": return outcome(Int32(probe_chmod(argument)), "changed the mode of \(argument)", closing: false)
        case "utime": return outcome(Int32(probe_utime(argument)), "touched the times of \(argument)", closing: false)
        case "xattr": return outcome(Int32(probe_xattr(argument)), "set an xattr on \(argument)", closing: false)
        case "stat":
            var info = stat()
            return outcome(stat(argument, &info), "stat \(argument)", closing: false)
        case "inotify": return outcome(Int32(probe_inotify(argument)), "watched \(argument)", closing: false)
        case "dgram": return outcome(Int32(probe_dgram(argument, 0)), "sent a datagram to \(argument)", closing: false)
        case "dgrampair": return outcome(Int32(probe_dgram(argument, 1)), "sent a datagram to \(argument) from a pair", closing: false)
        case "cmdline": return readFile("/proc/\(argument)/cmdline")
        case "sees": return sees(argument)
        case "list": return list(argument)
        case "manythreads": return manyThreads(Int(argument) ?? 1000)
        case "tmpfill": return fillTemporary(megabytes: Int(argument) ?? 128)
        case "tmpsize": return temporarySize()
        default: return "unknown attempt '\(name)'"
        }
    }

    /// Attempts on the file the host passed as the first item's descriptor attachment: reading it is the
    /// point ("fdread", allowed); writing through it ("fdwrite") or reopening it for writing through /proc
    /// ("fdreopen") must be refused. Nothing is written if they are not: a zero-length write.
    static func withAttachment(_ name: String, _ file: FileAttachment) -> String {
        file.withUnsafeFileDescriptor { fd in
            switch name {
            case "fdread":
                guard let bytes = try? file.readAll() else { return "refused: \(describe(errno))" }
                return "allowed: read \(bytes.count) bytes"
            case "fdwrite":
                var byte: UInt8 = 0
                return pwrite(fd, &byte, 0, 0) < 0 ? "refused: \(describe(errno))" : "allowed: wrote through the attachment"
            case "fdreopen":
                return outcome(open("/proc/self/fd/\(fd)", O_RDWR | O_CLOEXEC), "reopened the attachment for writing")
            default:
                return "unknown attempt '\(name)' with an attachment"
            }
        }
    }

    static func describe(_ error: Int32) -> String { "errno \(error) (\(String(cString: strerror(error))))" }

    /// "allowed" for a non-negative result (closing it if it is a descriptor the caller did not keep).
    static func outcome(_ result: Int32, _ what: String, closing: Bool = true) -> String {
        if result < 0 { return "refused: \(describe(errno))" }
        if closing && result > 2 { close(result) }
        return "allowed: \(what)"
    }

    static func readFile(_ path: String) -> String {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return "refused: \(describe(errno))" }
        defer { close(fd) }
        var byte: UInt8 = 0
        let n = read(fd, &byte, 1)
        return n < 0 ? "refused: read: \(describe(errno))" : "allowed: read \(path)"
    }

    static func createFile(_ path: String) -> String {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return "refused: \(describe(errno))" }
        close(fd)
        unlink(path)
        return "allowed: created \(path)"
    }

    static func loopback(_ port: UInt16) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        return address
    }

    static func connectInet(port: String, type: __socket_type) -> String {
        let fd = socket(AF_INET, Int32(type.rawValue), 0)
        guard fd >= 0 else { return "refused: socket: \(describe(errno))" }
        defer { close(fd) }
        var address = loopback(UInt16(port) ?? 9)
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else { return "refused: connect: \(describe(errno))" }
        if type == SOCK_DGRAM {
            let sent = send(fd, "x", 1, 0)
            if sent < 0 { return "refused: send: \(describe(errno))" }
        }
        return "allowed: connected to 127.0.0.1:\(port)"
    }

    static func connectUnix(_ path: String, abstract: Bool) -> String {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return "refused: socket: \(describe(errno))" }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8.prefix(100))
        let offset = abstract ? 1 : 0  // an abstract name starts with a NUL byte
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, b) in bytes.enumerated() { raw[i + offset] = b }
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + offset + (abstract ? 0 : 1))
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, length) }
        }
        return rc == 0 ? "allowed: connected to \(abstract ? "@" : "")\(path)" : "refused: connect: \(describe(errno))"
    }

    static func ptraceSeize(_ pid: pid_t) -> String {
        probe_ptrace_seize(pid) == 0 ? "allowed: seized \(pid) (and detached)" : "refused: \(describe(errno))"
    }

    static func mountOver(_ folder: String) -> String {
        probe_mount(folder) == 0 ? "allowed: mounted over \(folder) (and unmounted)" : "refused: \(describe(errno))"
    }

    static func ioUring() -> String { outcome(Int32(probe_io_uring_setup()), "an io_uring") }

    static func forkChild() -> String {
        let pid = fork()
        if pid == 0 { _exit(0) }
        guard pid > 0 else { return "refused: \(describe(errno))" }
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        return "allowed: forked \(pid)"
    }

    /// This program again, in a child: what it may exec without AllowSubprocesses' refusal. Its report is its
    /// capability sets and no_new_privs after that exec, with spaces for tabs and newlines.
    static func execSelf() -> String {
        var report = [CChar](repeating: 0, count: 2048)
        let n = probe_exec_self(&report, report.count)
        guard n >= 0 else { return "refused: \(describe(Int32(-n)))" }
        let text = String(decoding: report.prefix(n).map { UInt8(bitPattern: $0) }, as: UTF8.self).split(whereSeparator: { $0 == "\n" || $0 == "\t" }).joined(separator: " ")
        return "allowed: exec'd itself: \(text)"
    }

    static func execProgram(_ path: String) -> String {
        let program = path.isEmpty ? "/bin/true" : path
        let argv: [UnsafeMutablePointer<CChar>?] = [strdup(program), nil]
        execv(program, argv)
        return "refused: \(describe(errno))"
    }

    /// `kind:MB`: anonymous, shared or memfd memory. Maps the whole size, touches at most 64 MiB of it.
    static func memoryBomb(_ argument: String) -> String {
        let parts = argument.split(separator: ":")
        let kind = parts.first.map(String.init) ?? "anonymous"
        let size = (parts.count > 1 ? Int(parts[1]) : nil).map { $0 << 20 } ?? 8 << 30
        var fd: Int32 = -1
        var flags = MAP_PRIVATE | MAP_ANONYMOUS
        switch kind {
        case "shared": flags = MAP_SHARED | MAP_ANONYMOUS
        case "memfd":
            signal(SIGXFSZ, SIG_IGN)
            fd = Int32(probe_memfd())
            guard fd >= 0 else { return "refused: memfd_create: \(describe(errno))" }
            guard ftruncate(fd, off_t(size)) == 0 else {
                let e = errno
                close(fd)
                return "refused: ftruncate: \(describe(e))"
            }
            flags = MAP_SHARED
        default: break
        }
        defer { if fd >= 0 { close(fd) } }
        guard let memory = mmap(nil, size, PROT_READ | PROT_WRITE, flags, fd, 0), memory != MAP_FAILED else {
            return "refused: mmap: \(describe(errno))"
        }
        let touched = min(size, 64 << 20)
        memset(memory, 1, touched)
        munmap(memory, size)
        return "allowed: mapped \(size >> 20) MiB (\(kind))"
    }

    static func raiseLimit() -> String {
        var limit = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_AS.rawValue), &limit)
        let before = limit.rlim_max
        limit.rlim_cur = rlim_t.max
        limit.rlim_max = rlim_t.max
        guard setrlimit(__rlimit_resource_t(RLIMIT_AS.rawValue), &limit) == 0 else {
            return "refused: \(describe(errno)) (RLIMIT_AS stays \(before == rlim_t.max ? "unlimited" : "\(before >> 20) MiB"))"
        }
        return "allowed: RLIMIT_AS raised from \(before == rlim_t.max ? "unlimited" : "\(before >> 20) MiB")"
    }

    /// A grandchild in its own session, holding an exclusive lock on `path` until it dies: the test tells
    /// whether it outlived the worker by trying the lock.
    static func orphan(_ path: String) -> String {
        let child = fork()
        guard child >= 0 else { return "refused: \(describe(errno))" }
        if child == 0 {
            setsid()
            let grandchild = fork()
            if grandchild == 0 {
                let fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
                if fd >= 0, flock(fd, LOCK_EX) == 0 {
                    while true { pause() }
                }
                _exit(1)
            }
            _exit(grandchild > 0 ? 0 : 1)
        }
        var status: Int32 = 0
        waitpid(child, &status, 0)
        // Give the grandchild a moment to take its lock before the reply lets the test look.
        for _ in 0..<200 {
            let fd = open(path, O_WRONLY | O_CLOEXEC)
            if fd >= 0 {
                let locked = flock(fd, LOCK_EX | LOCK_NB) != 0
                close(fd)
                if locked { return "allowed: an orphan holds \(path)" }
            }
            usleep(10_000)
        }
        return "refused: the orphan never took its lock"
    }

    /// What the worker runs under, read from /proc/self/status: seccomp mode, no_new_privs, capabilities.
    static func layers() -> String {
        var text = "allowed: pid \(getpid()) ppid \(getppid()) uid \(getuid())"
        let fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return text + " (status unreadable: \(describe(errno)))" }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 8192)
        let n = read(fd, &bytes, bytes.count)
        let status = String(decoding: bytes.prefix(max(n, 0)), as: UTF8.self)
        for line in status.split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 1).map { $0.trimmingPrefix(while: \.isWhitespace) }
            guard parts.count == 2 else { continue }
            switch parts[0] {
            case "Seccomp": text += " seccomp \(parts[1].trimmingPrefix(while: \.isWhitespace))"
            case "NoNewPrivs": text += " nnp \(parts[1].trimmingPrefix(while: \.isWhitespace))"
            case "CapEff": text += " capeff \(parts[1].trimmingPrefix(while: \.isWhitespace))"
            default: break
            }
        }
        return text
    }

    static func timer() -> String {
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(20)) { done.signal() }
        return done.wait(timeout: .now() + .seconds(10)) == .success ? "allowed: a timer fired" : "refused: no timer"
    }

    static func threads() -> String {
        var handles: [pthread_t] = []
        for _ in 0..<4 {
            var thread = pthread_t()
            guard pthread_create(&thread, nil, { _ in nil }, nil) == 0 else { return "refused: pthread_create failed" }
            handles.append(thread)
        }
        for thread in handles { pthread_join(thread, nil) }
        return "allowed: 4 threads"
    }

    /// `file=needle`: whether `file` (under /proc, say) can be read and mentions `needle` (a path or name of
    /// the test's own): the machine's sockets, mounts or processes seen from inside.
    /// What a folder of the worker's root holds, sorted: "allowed: a b c".
    static func list(_ path: String) -> String {
        var buffer = [CChar](repeating: 0, count: 16384)
        let n = probe_list(path, &buffer, buffer.count)
        guard n >= 0 else { return "refused: \(describe(Int32(-n)))" }
        let text = String(decoding: buffer[0..<Int(n)].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return "allowed: " + text.split(separator: "\n").sorted().joined(separator: " ")
    }

    static func sees(_ argument: String) -> String {
        let parts = argument.split(separator: "=", maxSplits: 1).map(String.init)
        guard parts.count == 2 else { return "unknown: sees needs file=needle" }
        let fd = open(parts[0], O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return "refused: \(describe(errno))" }
        defer { close(fd) }
        var text: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while text.count < 16 << 20 {
            let n = read(fd, &chunk, chunk.count)
            if n <= 0 { break }
            text += chunk[0..<n]
        }
        let found = String(decoding: text, as: UTF8.self).contains(parts[1])
        return found ? "allowed: \(parts[0]) shows \(parts[1])" : "refused: \(parts[0]) does not show it"
    }

    /// Starts up to `count` threads that wait, then lets them go: how many the worker may have at once.
    static func manyThreads(_ count: Int) -> String {
        let gate = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        pthread_mutex_init(gate, nil)
        pthread_mutex_lock(gate)
        var handles: [pthread_t] = []
        for _ in 0..<min(count, 20_000) {
            var thread = pthread_t()
            let rc = pthread_create(&thread, nil, { arg in
                let gate = arg!.assumingMemoryBound(to: pthread_mutex_t.self)
                pthread_mutex_lock(gate)
                pthread_mutex_unlock(gate)
                return nil
            }, gate)
            if rc != 0 { break }
            handles.append(thread)
        }
        pthread_mutex_unlock(gate)
        for thread in handles { pthread_join(thread, nil) }
        pthread_mutex_destroy(gate)
        gate.deallocate()
        return handles.count >= count ? "allowed: \(handles.count) threads" : "refused: stopped at \(handles.count) threads"
    }

    /// How large TMPDIR's file system is (statvfs), in MiB.
    static func temporarySize() -> String {
        guard let folder = getenv("TMPDIR").map({ String(cString: $0) }) else { return "refused: no TMPDIR" }
        var info = statvfs()
        guard statvfs(folder, &info) == 0 else { return "refused: \(describe(errno))" }
        return "allowed: TMPDIR holds \((UInt64(info.f_blocks) * UInt64(info.f_frsize)) >> 20) MiB"
    }

    /// Writes up to `megabytes` MiB into TMPDIR, then removes the file.
    static func fillTemporary(megabytes: Int) -> String {
        guard let folder = getenv("TMPDIR").map({ String(cString: $0) }) else { return "refused: no TMPDIR" }
        let path = "\(folder)/fill"
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return "refused: \(describe(errno))" }
        defer {
            close(fd)
            unlink(path)
        }
        signal(SIGXFSZ, SIG_IGN)
        let block = [UInt8](repeating: 1, count: 1 << 20)
        for written in 0..<megabytes {
            guard write(fd, block, block.count) == block.count else {
                return "refused: stopped at \(written) MiB: \(describe(errno))"
            }
        }
        return "allowed: wrote \(megabytes) MiB into TMPDIR"
    }

    static func urandom() -> String {
        var bytes = [UInt8](repeating: 0, count: 16)
        let fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return "refused: \(describe(errno))" }
        defer { close(fd) }
        return read(fd, &bytes, 16) == 16 ? "allowed: 16 random bytes" : "refused: \(describe(errno))"
    }

    static func tmpdir() -> String {
        guard let folder = getenv("TMPDIR").map({ String(cString: $0) }) else { return "refused: no TMPDIR" }
        let path = "\(folder)/probe"
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return "refused: \(describe(errno))" }
        defer { close(fd) }
        guard write(fd, "hello", 5) == 5 else { return "refused: write: \(describe(errno))" }
        return "allowed: wrote \(path)"
    }
}
