// Unix stream sockets for the daemon and its clients: listen, connect, accept, peer credentials, and the
// signalfd the daemon uses to turn SIGTERM/SIGINT into loop events.

#if canImport(Glibc)
import Glibc
#endif
import CSDKShim

/// A non-blocking, close-on-exec socket listening on `path`.
public func listenUnix(path: String, backlog: Int32 = 128) throws(SystemError) -> FileDescriptor {
    let fd = sdk_unix_listen(path, backlog)
    guard fd >= 0 else { throw SystemError("bind/listen", errno: errno, detail: path) }
    return FileDescriptor(adopting: fd)
}

/// A non-blocking, close-on-exec socket connected to `path`.
public func connectUnix(path: String) throws(SystemError) -> FileDescriptor {
    let fd = sdk_unix_connect(path)
    guard fd >= 0 else { throw SystemError("connect", errno: errno, detail: path) }
    return FileDescriptor(adopting: fd)
}

/// Accepts one pending connection (non-blocking, close-on-exec), or nil when none is pending.
public func acceptConnection(_ listener: Int32) throws(SystemError) -> FileDescriptor? {
    while true {
        let fd = sdk_accept(listener)
        if fd >= 0 { return FileDescriptor(adopting: fd) }
        let e = errno
        if e == EINTR || e == ECONNABORTED { continue }
        if e == EAGAIN || e == EWOULDBLOCK { return nil }
        checkBadDescriptor(e, "accept4")
        throw SystemError("accept4", errno: e, detail: "fd \(listener)")
    }
}

/// The process on the other end of a Unix socket, as the kernel recorded it at connect time.
public struct PeerCredentials: Sendable, Equatable {
    public var pid: pid_t
    public var uid: uid_t
    public var gid: gid_t

    /// Credentials as given (the simulation's clients have no kernel to ask).
    package init(pid: pid_t, uid: uid_t, gid: gid_t) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }
}

/// SO_PEERCRED for a connected Unix socket.
public func peerCredentials(_ fd: Int32) throws(SystemError) -> PeerCredentials {
    var pid: pid_t = 0, uid: uid_t = 0, gid: gid_t = 0
    try retryingEINTR("getsockopt(SO_PEERCRED)") { sdk_peer_credentials(fd, &pid, &uid, &gid) }
    return PeerCredentials(pid: pid, uid: uid, gid: gid)
}

/// Blocks SIGTERM and SIGINT for the calling thread (call it before starting any thread) and returns a
/// signalfd that reports them.
public func terminationSignalDescriptor() throws(SystemError) -> FileDescriptor {
    let fd = sdk_termination_signalfd()
    guard fd >= 0 else { throw SystemError("signalfd", errno: errno) }
    return FileDescriptor(adopting: fd)
}

/// The next pending signal on a signalfd, or nil if none is pending.
public func readSignal(_ fd: Int32) -> Int32? {
    let s = sdk_read_signalfd(fd)
    return s > 0 ? s : nil
}

/// Whether `fd` is a listening Unix stream socket.
public func isListeningUnixStreamSocket(_ fd: Int32) -> Bool { sdk_is_listening_unix_stream(fd) == 1 }

/// The path a Unix socket is bound to, or nil.
public func boundSocketPath(_ fd: Int32) -> String? {
    var buffer = [CChar](repeating: 0, count: 110)
    guard sdk_socket_path(fd, &buffer, buffer.count) == 0 else { return nil }
    return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// Sends `message` as one datagram to the Unix socket at `path` ("@name": abstract). Never blocks.
public func sendDatagram(_ message: String, to path: String) throws(SystemError) {
    var message = message
    let rc = message.withUTF8 { bytes in
        bytes.withMemoryRebound(to: CChar.self) { sdk_notify_datagram(path, $0.baseAddress, $0.count) }
    }
    guard rc == 0 else { throw SystemError("sendto(\(path))", errno: errno) }
}
