// A test process that traps leaves no process it registered with KillOnTermination (a DaemonProcess's daemon, a
// bench's peer) behind, and still dies through the handler that was there before (the runtime's backtrace).
import SDKPosix
import CSDKShim
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct KillOnTerminationTests {
    /// The exit status of the trapping copy when the handler that was there before KillOnTermination's ran.
    static let previousHandlerStatus: Int32 = 99

    /// Run by the test below in a copy of this test process (`SDKHOST_TRAP_FD` names its pipe's write end): sets a
    /// trap handler of its own (exits 99), starts a sleeper in a session of its own with that pipe as its stdout,
    /// registers it (KillOnTermination's first use here: its handlers go on top), writes its pid, and traps.
    @Test(.enabled(if: getenv("SDKHOST_TRAP_FD") != nil, "a helper: runs only in the copy the test below starts"))
    func trapAfterRegisteringASleeper() {
        guard let raw = getenv("SDKHOST_TRAP_FD"), let fd = Int32(String(cString: raw)) else { return }
        for sig in [SIGILL, SIGTRAP] { signal(sig) { _ in _exit(KillOnTerminationTests.previousHandlerStatus) } }
        guard let pid = spawnInASessionOfItsOwn(["/bin/sleep", "120"], environment: nil, { posix_spawn_file_actions_adddup2(&$0, fd, 1) })
        else { _exit(3) }
        KillOnTermination.add(pid)
        let line = Array("\(pid)\n".utf8)
        _ = line.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        preconditionFailure("a deliberate trap, with a sleeper registered")
    }

    @Test func aTrapKillsWhatWasRegisteredAndStillDiesOfIt() async throws {
        // Close-on-exec, so that no process another test starts meanwhile holds the write end; the copy gets it as 3.
        var ends: [Int32] = [-1, -1]
        #expect(sdk_pipe_cloexec(&ends) == 0)
        defer { close(ends[0]) }
        // This very test binary, running only the test above, in a session of its own, its output discarded.
        let environment = (0..<Int.max).lazy.map { environ[$0] }.prefix { $0 != nil }.map { String(cString: $0!) }
            .filter { !$0.hasPrefix("SDKHOST_TRAP_FD=") } + ["SDKHOST_TRAP_FD=3"]
        let started = spawnInASessionOfItsOwn(
            ["/proc/self/exe", "--testing-library", "swift-testing", "--filter", "trapAfterRegisteringASleeper"],
            environment: environment
        ) { actions in
            posix_spawn_file_actions_adddup2(&actions, ends[1], 3)  // dup2 clears close-on-exec
            posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
            posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        }
        close(ends[1])
        let pid = try #require(started)
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        // Its trap went on to the handler that was there before KillOnTermination's.
        #expect(status & 0x7F == 0 && (status >> 8) & 0xFF == Self.previousHandlerStatus, "status \(status)")
        // Its sleeper's pid, then end-of-file once the sleeper (the last holder of the pipe) is gone.
        var text: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 64)
        var ended = false
        let deadline = monotonicNanoseconds() + 30_000_000_000
        while monotonicNanoseconds() < deadline {
            var poll = pollfd(fd: ends[0], events: Int16(POLLIN), revents: 0)
            guard Glibc.poll(&poll, 1, 200) > 0 else { continue }
            let n = read(ends[0], &buffer, buffer.count)
            if n <= 0 { ended = n == 0; break }
            text += buffer[0..<n]
        }
        let sleeper = pid_t(String(decoding: text.filter { $0 >= 0x30 && $0 <= 0x39 }, as: UTF8.self))
        #expect(sleeper != nil, "the trapping process wrote '\(String(decoding: text, as: UTF8.self))'")
        #expect(ended, "the registered sleeper outlived the process that trapped")
        // Harmless when the defence fails: the sleeper, in its own session, is ended by its pid.
        if !ended, let sleeper { kill(sleeper, SIGKILL) }
    }
}

/// Spawns `arguments` (the first the program's path) in a session of its own, with `environment` (nil: this
/// process's) and the file actions `setUp` adds; its pid, or nil.
func spawnInASessionOfItsOwn(_ arguments: [String], environment: [String]?,
                             _ setUp: (inout posix_spawn_file_actions_t) -> Void) -> pid_t? {
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    posix_spawnattr_setflags(&attributes, 0x80)  // POSIX_SPAWN_SETSID (glibc's value; Swift does not import it)
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    setUp(&actions)
    let argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
    let envp: [UnsafeMutablePointer<CChar>?]? = environment.map { $0.map { strdup($0) } + [nil] }
    defer { for p in argv + (envp ?? []) { free(p) } }
    var pid: pid_t = 0
    let rc = envp.map { posix_spawn(&pid, arguments[0], &actions, &attributes, argv, $0) }
        ?? posix_spawn(&pid, arguments[0], &actions, &attributes, argv, environ)
    return rc == 0 ? pid : nil
}
