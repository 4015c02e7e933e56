// A real `sdk-host serve` process for the daemon tests: its own folder, config, socket and log.
import SDKWire
import FoundationEssentials
import HostTestSupport
import SDKHost
import SDKPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

let sdkHostBinary = (currentExecutableDirectory() ?? ".") + "/sdk-host"

/// Runs a program with the given stdout/stderr files (or inherited), returning its pid.
func spawnProgram(_ arguments: [String], stdout: String? = nil, stderr: String? = nil, environment: [String] = [],
                  fd3: Int32? = nil) -> pid_t {
    // `VAR=value exec` sets them for the program only; LISTEN_PID=$$ is the pid the program keeps after exec.
    var script = environment.map { "\($0) " }.joined() + "exec \"$@\""
    if let stdout { script += " >'\(stdout)'" }
    if let stderr { script += " 2>'\(stderr)'" }
    var pid: pid_t = 0
    let argv = (["/bin/sh", "-c", script, "sh"] + arguments).map { strdup($0) } + [nil]
    defer { for p in argv { free(p) } }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    if let fd3 { posix_spawn_file_actions_adddup2(&actions, fd3, 3) }  // dup2 clears close-on-exec
    precondition(posix_spawn(&pid, "/bin/sh", &actions, nil, argv, environ) == 0)
    return pid
}

/// Whether something accepts connections on the Unix socket at `path` (the connection is closed at once).
func socketAccepts(_ path: String) -> Bool {
    guard let fd = try? connectUnix(path: path) else { return false }
    fd.close()
    return true
}

/// Waits for `pid` to exit (up to `timeout` seconds) and returns its exit status, or nil on timeout.
func waitExit(_ pid: pid_t, timeout: Double = 60) async -> Int32? {
    let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
    while monotonicNanoseconds() < deadline {
        var status: Int32 = 0
        let r = waitpid(pid, &status, WNOHANG)
        if r == pid { return (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F) }
        if r < 0 { return nil }
        try? await Task.sleep(nanoseconds: 5_000_000)
    }
    return nil
}

/// Runs a command that prints JSON (its stdout to a file in `folder`), expects exit status 0 (its stderr in the
/// message otherwise), and decodes what it printed with Foundation's JSONDecoder, a reader independent of ours.
func decodeOutput<T: Decodable>(
    _ type: T.Type, of arguments: [String], in folder: String, timeout: Double = 60,
    sourceLocation: SourceLocation = #_sourceLocation
) async throws -> T {
    let out = "\(folder)/out-\(monotonicNanoseconds()).json", err = out + ".err"
    defer {
        unlink(out)
        unlink(err)
    }
    let pid = spawnProgram(arguments, stdout: out, stderr: err)
    #expect(await waitExit(pid, timeout: timeout) == 0, "\(readSmallFile(err) ?? "")", sourceLocation: sourceLocation)
    return try JSONDecoder().decode(T.self, from: Data((readSmallFile(out) ?? "").utf8))
}

final class DaemonProcess {
    let folder: String
    let socket: String
    let configPath: String
    let log: String
    private(set) var pid: pid_t = 0

    /// Writes a config (extra keys as raw XML) and starts the daemon; waits until its socket answers.
    private let descriptorLimit: Int?
    private let stderrPath: String?
    /// Variables set for the daemon only (systemd's, in SystemdTests).
    private let environment: [String]
    /// With socket activation: the listening socket this test made, passed as fd 3 (as systemd does).
    private(set) var activatedListener: Int32?

    init(extraConfig: String = "", socketMode: Int = 0o600, folderMode: mode_t = 0o700, descriptorLimit: Int? = nil,
         stderrPath: String? = nil, extraSearchPaths: [String] = [], environment: [String] = [],
         socketActivated: Bool = false, beforeStart: (String) -> Void = { _ in }) async throws
    {
        self.descriptorLimit = descriptorLimit
        self.stderrPath = stderrPath
        self.environment = environment
        var template = "/tmp/sdkhost-daemon-XXXXXX".utf8CString
        folder = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        chmod(folder, folderMode)
        if socketActivated {
            // The configured SocketPath stays unused: the daemon must serve the socket it inherits.
            socket = "\(folder)/activated.sock"
            activatedListener = try listenUnix(path: socket).release()
        } else {
            socket = "\(folder)/d.sock"
        }
        configPath = "\(folder)/sdk-host.plist"
        log = "\(folder)/daemon.log"
        writeFile(configPath, """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict>
              <key>ExtensionSearchPaths</key><array><string>\(packageRoot)/Extensions</string>\(
                  extraSearchPaths.map { "<string>\($0)</string>" }.joined())</array>
              <key>SocketPath</key><string>\(socketActivated ? "\(folder)/configured.sock" : socket)</string>
              <key>SocketMode</key><integer>\(socketMode)</integer>
              \(extraConfig.contains("<key>LogLevel</key>") ? "" : "<key>LogLevel</key><string>info</string>")
              \(extraConfig)
            </dict></plist>
            """)
        beforeStart(folder)
        try await start()
    }

    func start() async throws {
        var command = [sdkHostBinary, "serve", "--config", configPath]
        if let descriptorLimit { command = ["/bin/sh", "-c", "ulimit -n \(descriptorLimit) && exec \"$@\"", "sh"] + command }
        if pid != 0 { KillOnTermination.remove(pid) }
        var environment = self.environment
        if activatedListener != nil { environment += ["LISTEN_PID=$$", "LISTEN_FDS=1", "LISTEN_FDNAMES=sdk-host"] }
        pid = spawnProgram(command, stderr: stderrPath ?? log, environment: environment, fd3: activatedListener)
        KillOnTermination.add(pid)
        let up = await eventually(timeout: 30) { socketAccepts(self.socket) }
        guard up else { throw SystemError("daemon start", errno: ETIMEDOUT, detail: readSmallFile(log) ?? "") }
    }

    var crashFolder: String { "\(folder)/crashes" }
    var logText: String { (try? readFile(log)).map { String(decoding: $0, as: UTF8.self) } ?? "" }

    /// Descriptors the daemon holds and its live children.
    var resources: (descriptors: Int, children: Int) {
        let fds = (listNames("/proc/\(pid)/fd") ?? []).count
        let children = childProcesses(of: pid, includingZombies: false).count
        return (fds, children)
    }

    func signal(_ s: Int32) { kill(pid, s) }

    func stop() async -> Int32? {
        kill(pid, SIGTERM)
        let status = await waitExit(pid)
        if status != nil { KillOnTermination.remove(pid) }  // reaped: the pid may be reused
        return status
    }

    /// Kills the daemon if a failed test left it running (by pid, never by name), then removes the folder,
    /// reaping the `rm` so no zombie is left behind.
    func remove() {
        var status: Int32 = 0
        if waitpid(pid, &status, WNOHANG) == 0 {
            kill(pid, SIGKILL)
            while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        }
        KillOnTermination.remove(pid)
        if let fd = activatedListener { close(fd) }
        activatedListener = nil
        removeFolder(folder)
    }

    /// The daemon's resident set in bytes (VmRSS), or nil if it is gone.
    var residentBytes: Int? { HostTestSupport.residentBytes(of: "\(pid)") }

    /// CPU seconds (user + system) the daemon has used.
    var cpuSeconds: Double {
        guard let fields = procStatFields("\(pid)"), fields.count > 12 else { return 0 }
        let ticks = (Int(fields[11]) ?? 0) + (Int(fields[12]) ?? 0)  // utime, stime
        return Double(ticks) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Whether the daemon process is still running (signal 0: nothing is sent).
    var isAlive: Bool {
        var status: Int32 = 0
        return waitpid(pid, &status, WNOHANG) == 0 && kill(pid, 0) == 0
    }

    /// Bytes of log written so far.
    var logBytes: Int {
        var st = stat()
        return stat(log, &st) == 0 ? Int(st.st_size) : 0
    }
}

/// rm -rf, waited for.
func removeFolder(_ path: String) {
    var status: Int32 = 0
    let pid = spawnProgram(["rm", "-rf", path])
    while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
}

/// python3, for the tests that use it as an independent peer (skipped without it); nil if not installed.
let python3: String? = {
    let folders = ["/usr/bin", "/usr/local/bin"] + (environmentValue("PATH")?.split(separator: ":").map(String.init) ?? [])
    return folders.map { "\($0)/python3" }.first { (path: String) in access(path, X_OK) == 0 }
}()
