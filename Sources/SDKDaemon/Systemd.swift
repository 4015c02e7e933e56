// The daemon's side of systemd, without libsystemd (shared/DESIGN.md "Operating the daemon"):
// - socket activation: LISTEN_PID/LISTEN_FDS hand over the listening socket as fd 3 (sd_listen_fds);
// - readiness: READY=1, STATUS=…, RELOADING=1, STOPPING=1 as datagrams to $NOTIFY_SOCKET (sd_notify);
// - watchdog: WATCHDOG=1 every half of $WATCHDOG_USEC, sent from the event loop, so a stuck loop stops them;
// - journald: with $JOURNAL_STREAM naming our stderr, log lines carry `<N>` priority prefixes.
// Each is off when its variable is absent, so `sdk-host serve` from a shell behaves as before.
import SDKHost
import SDKPosix

#if canImport(Glibc)
import Glibc
#endif

package enum Systemd {
    /// The first descriptor systemd passes (SD_LISTEN_FDS_START).
    static let firstPassedDescriptor: Int32 = 3

    /// The listening socket systemd passed, if LISTEN_PID names this process. The variables are removed so that
    /// workers never see them. Throws when the variables are set for us but fd 3 is not a listening Unix socket.
    static func inheritedListener() throws(HostError) -> Int32? {
        guard let pidText = environment("LISTEN_PID"), let countText = environment("LISTEN_FDS") else { return nil }
        for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] { unsetenv(name) }
        guard Int32(pidText) == getpid() else { return nil }  // meant for another process (we were exec'd by it)
        guard let count = Int(countText), count >= 1 else {
            throw HostError(.invalidConfiguration, "LISTEN_FDS=\(countText): expected at least one socket")
        }
        if count > 1 {
            throw HostError(.invalidConfiguration, "LISTEN_FDS=\(count): sdk-host serves one socket; give its .socket unit one ListenStream")
        }
        let fd = firstPassedDescriptor
        guard isListeningUnixStreamSocket(fd) else {
            throw HostError(.invalidConfiguration, "LISTEN_FDS: fd \(fd) is not a listening Unix stream socket")
        }
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        return fd
    }

    /// Sends `state` (lines such as "READY=1") to $NOTIFY_SOCKET; does nothing without it.
    static func notify(_ state: String) {
        guard let path = environment("NOTIFY_SOCKET") else { return }
        try? sendDatagram(state, to: path)
    }

    /// Half the watchdog interval in nanoseconds when systemd expects pings from this process.
    static func watchdogPingInterval() -> UInt64? {
        guard let usecText = environment("WATCHDOG_USEC"), let usec = UInt64(usecText), usec > 0 else { return nil }
        if let pid = environment("WATCHDOG_PID"), Int32(pid) != getpid() { return nil }
        return usec * 1000 / 2
    }

    /// Whether stderr is the journal stream systemd named in $JOURNAL_STREAM ("device:inode").
    static func stderrIsJournal() -> Bool {
        guard let value = environment("JOURNAL_STREAM") else { return false }
        let parts = value.split(separator: ":")
        guard parts.count == 2, let device = UInt64(parts[0]), let inode = UInt64(parts[1]) else { return false }
        var st = stat()
        guard fstat(2, &st) == 0 else { return false }
        return UInt64(st.st_dev) == device && UInt64(st.st_ino) == inode
    }

    /// A log handler that writes `<N>message` lines (syslog priorities) for journald, without timestamps.
    package static func journalLogHandler() -> @Sendable (LogLevel, String) -> Void {
        { level, message in
            let priority = switch level {
            case .debug: 7
            case .info: 6
            case .warning: 4
            case .error: 3
            }
            LogWriter.standardError.write("<\(priority)>\(message)\n")
        }
    }

    private static func environment(_ name: String) -> String? {
        guard let value = getenv(name), value.pointee != 0 else { return nil }
        return String(cString: value)
    }
}
