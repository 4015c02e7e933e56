// Snoop (com.example.snoop): an untrusted SDK that tries, with plain Glibc calls, what the sandbox must stop.
// The first item's title picks one attempt; the reply is "refused: <why>" or "ALLOWED". Each attempt is
// harmless if nothing stops it: signals are signal 0, files are only opened for reading or created in a
// folder the caller names, and sockets only connect to 127.0.0.1.
import SDKExtension

#if canImport(Glibc)
import Glibc
#endif

@main
struct Snoop: RequestHandler {
    func beginRequest(with context: ExtensionContext) {
        let attempt = context.inputItems.first?.title ?? ""
        context.completeRequest(returningItems: [ExtensionItem(title: Self.run(attempt))])
    }

    static func refused(_ what: String) -> String { "refused: \(what): \(String(cString: strerror(errno)))" }

    /// Opens `path` with `flags` and closes it again: "ALLOWED", or what refused it.
    static func tryOpen(_ path: String, _ flags: Int32) -> String {
        let fd = open(path, flags, 0o600)
        if fd < 0 { return refused("open \(path)") }
        close(fd)
        if flags & O_CREAT != 0 { unlink(path) }
        return "ALLOWED"
    }

    static func run(_ attempt: String) -> String {
        let host = getppid()
        switch attempt {
        case "shadow":
            return tryOpen("/etc/shadow", O_RDONLY)
        case "host-environ":
            return tryOpen("/proc/\(host)/environ", O_RDONLY)
        case "host-mem":
            return tryOpen("/proc/\(host)/mem", O_RDWR)
        case "signal-host":
            // In its own pid namespace the worker's parent is outside it: getppid() is 0, the host has no pid here.
            guard host > 0 else { return "refused: the host has no pid here (getppid() is 0: it is outside this pid namespace)" }
            return kill(host, 0) == 0 ? "ALLOWED" : refused("kill(host, 0)")
        case "fork":
            let pid = fork()
            if pid == 0 { _exit(0) }
            if pid < 0 { return refused("fork") }
            var status: Int32 = 0
            waitpid(pid, &status, 0)
            return "ALLOWED"
        case let tcp where tcp.hasPrefix("tcp:"):
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            if fd < 0 { return refused("socket(AF_INET)") }
            defer { close(fd) }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = in_port_t(UInt16(tcp.dropFirst(4)) ?? 0).bigEndian
            address.sin_addr.s_addr = in_addr_t(0x7F00_0001).bigEndian
            let r = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            return r == 0 ? "ALLOWED" : refused("connect 127.0.0.1")
        case let create where create.hasPrefix("create:"):
            return tryOpen(String(create.dropFirst(7)), O_WRONLY | O_CREAT | O_EXCL)
        case let read where read.hasPrefix("read:"):
            // Another file of the app's: its config, another extension's crash report.
            return tryOpen(String(read.dropFirst(5)), O_RDONLY)
        case let unix where unix.hasPrefix("unix:"):
            // A Unix socket outside the sandbox, such as the daemon's: talking to it would run other extensions.
            let path = String(unix.dropFirst(5))
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            if fd < 0 { return refused("socket(AF_UNIX)") }
            defer { close(fd) }
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                for (i, byte) in path.utf8.prefix(raw.count - 1).enumerated() { raw[i] = byte }
            }
            let r = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            return r == 0 ? "ALLOWED" : refused("connect \(path)")
        case "shared-memory":
            // 1 GiB of shared memory, more than the manifest's MemoryLimitMB; never touched, so harmless if granted.
            let size = 1 << 30
            let p = mmap(nil, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)
            if p == MAP_FAILED { return refused("mmap 1 GiB shared") }
            munmap(p, size)
            return "ALLOWED"
        case "tmpdir":
            // A control: the worker's private TMPDIR is writable.
            let folder = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
            return tryOpen("\(folder)/snoop-\(getpid())", O_WRONLY | O_CREAT | O_EXCL)
        default:
            return "unknown attempt '\(attempt)'"
        }
    }
}
