// Thin wrappers over the raw libc calls the rest of the package uses. Each reads errno at once, retries EINTR
// where that is safe, and returns a typed error. EBADF and EFAULT are programming errors and trap.

#if canImport(Glibc)
import Glibc
#endif
import CSDKShim

@inline(__always)
func checkBadDescriptor(_ e: Int32, _ operation: String) {
    if e == EBADF || e == EFAULT { fatalError("\(operation): \(String(cString: strerror(e))) — a descriptor bug") }
}

/// Runs `body` until it does not fail with EINTR; throws a `SystemError` for any other failure.
@inline(__always)
@discardableResult
func retryingEINTR<T: BinaryInteger>(_ operation: String, detail: @autoclosure () -> String = "", _ body: () -> T)
    throws(SystemError) -> T
{
    while true {
        let r = body()
        if r != -1 { return r }
        let e = errno
        if e == EINTR { continue }
        checkBadDescriptor(e, operation)
        throw SystemError(operation, errno: e, detail: detail())
    }
}

/// After a non-blocking call failed: nil for EINTR (call again), `.wouldBlock` for EAGAIN; throws a `SystemError`
/// for any other failure.
@inline(__always)
func nonBlockingFailure(_ operation: String, detail: @autoclosure () -> String) throws(SystemError) -> IOResult? {
    let e = errno
    if e == EINTR { return nil }
    if e == EAGAIN || e == EWOULDBLOCK { return .wouldBlock }
    checkBadDescriptor(e, operation)
    throw SystemError(operation, errno: e, detail: detail())
}

/// Monotonic time in nanoseconds.
@inline(__always)
public func monotonicNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

/// This process's id, read once (and again in a forked child): every spawn sends it twice, and each getpid was a
/// system call (glibc no longer caches the pid).
package enum ThisProcess {
    @inline(__always) package static var id: pid_t { sdk_process_id() }
}

/// Puts a descriptor in non-blocking mode (a status flag of the open file, not a descriptor flag).
public func setNonBlocking(_ fd: Int32) throws(SystemError) {
    if SimulatedKernel.isSimulated(fd) { return }  // always non-blocking
    let flags = try retryingEINTR("fcntl(F_GETFL)") { fcntl(fd, F_GETFL) }
    try retryingEINTR("fcntl(F_SETFL)") { fcntl(fd, F_SETFL, flags | O_NONBLOCK) }
}

/// Outcome of a non-blocking read or write.
public enum IOResult: Equatable, Sendable {
    /// This many bytes were transferred (never 0 for a read; see `.endOfFile`).
    case bytes(Int)
    /// The call would block.
    case wouldBlock
    /// The peer closed (read only).
    case endOfFile
}

/// read(2) on a non-blocking descriptor.
public func readNonBlocking(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) throws(SystemError) -> IOResult {
    if SimulatedKernel.isSimulated(fd) {
        var none: [Int32] = [], truncated = false
        return try simulatedResult("read", fd, reading: true, kernel(fd).receive(fd, into: buffer, descriptors: &none, maxDescriptors: 0, truncated: &truncated))
    }
    while true {
        let n = read(fd, buffer.baseAddress, buffer.count)
        if n > 0 { return .bytes(n) }
        if n == 0 { return .endOfFile }
        if let result = try nonBlockingFailure("read", detail: "fd \(fd)") { return result }
    }
}

/// send(2) with MSG_NOSIGNAL on a non-blocking socket (a closed peer is an error, never SIGPIPE).
public func sendNonBlocking(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) throws(SystemError) -> IOResult {
    if SimulatedKernel.isSimulated(fd) { return try simulatedResult("send", fd, kernel(fd).send(fd, buffer, descriptors: [])) }
    while true {
        let n = send(fd, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL))
        if n >= 0 { return .bytes(n) }
        if let result = try nonBlockingFailure("send", detail: "fd \(fd)") { return result }
    }
}

/// Writes all of `buffer` to a blocking descriptor (a file, or a pipe with room for it). `detail` names it in
/// the error.
public func writeAll(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, detail: String) throws(SystemError) {
    if SimulatedKernel.isSimulated(fd) { return try simulatedWriteAll("write", fd, buffer, descriptors: []) }
    var offset = 0
    while offset < buffer.count {
        let n = try retryingEINTR("write", detail: detail) { write(fd, buffer.baseAddress! + offset, buffer.count - offset) }
        offset += n
    }
}

/// Writes all of `buffer` to a blocking descriptor with MSG_NOSIGNAL.
public func sendAll(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) throws(SystemError) {
    if SimulatedKernel.isSimulated(fd) { return try simulatedWriteAll("send", fd, buffer, descriptors: []) }
    var offset = 0
    while offset < buffer.count {
        let n = try retryingEINTR("send", detail: "fd \(fd)") {
            send(fd, buffer.baseAddress! + offset, buffer.count - offset, Int32(MSG_NOSIGNAL))
        }
        offset += n
    }
}

/// recvmsg(2) on a non-blocking socket, appending any descriptors that came with the bytes (SCM_RIGHTS,
/// close-on-exec) to `descriptors`, which then belong to the caller. `truncated` is set when the peer sent more
/// descriptors than one message may carry (the kernel closed the excess) or control data of another kind.
public func receiveNonBlocking(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, descriptors: inout [Int32],
                               truncated: inout Bool) throws(SystemError) -> IOResult
{
    if SimulatedKernel.isSimulated(fd) {
        return try simulatedResult("recvmsg", fd, reading: true, kernel(fd).receive(fd, into: buffer, descriptors: &descriptors,
                                                                     maxDescriptors: Int(SDK_MAX_MESSAGE_FDS), truncated: &truncated))
    }
    var count: Int32 = 0
    var cut: Int32 = 0
    while true {
        // On the stack: this runs for every read of every connection.
        let n = withUnsafeTemporaryAllocation(of: Int32.self, capacity: Int(SDK_MAX_MESSAGE_FDS)) { fds in
            let n = sdk_recv_with_fds(fd, buffer.baseAddress, buffer.count, fds.baseAddress, SDK_MAX_MESSAGE_FDS, &count, &cut)
            if count > 0 { descriptors.append(contentsOf: fds[0..<Int(count)]) }
            return n
        }
        if cut != 0 { truncated = true }
        if n > 0 { return .bytes(n) }
        if n == 0 { return .endOfFile }
        if let result = try nonBlockingFailure("recvmsg", detail: "fd \(fd)") { return result }
    }
}

/// sendmsg(2) with MSG_NOSIGNAL on a non-blocking socket, `descriptors` (at most 64) attached to the first byte.
/// They have been sent once any byte has.
public func sendNonBlocking(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, descriptors: [Int32]) throws(SystemError) -> IOResult {
    if descriptors.isEmpty { return try sendNonBlocking(fd, buffer) }
    if SimulatedKernel.isSimulated(fd) { return try simulatedResult("sendmsg", fd, kernel(fd).send(fd, buffer, descriptors: descriptors)) }
    while true {
        let n = descriptors.withUnsafeBufferPointer { fds in
            sdk_send_with_fds(fd, buffer.baseAddress, buffer.count, fds.baseAddress, Int32(fds.count), 0)
        }
        if n >= 0 { return .bytes(n) }
        if let result = try nonBlockingFailure("sendmsg", detail: "fd \(fd), \(descriptors.count) descriptor(s)") { return result }
    }
}

/// Writes all of `buffer` to a blocking socket, `descriptors` (at most 64) attached to its first byte.
public func sendAll(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, descriptors: [Int32]) throws(SystemError) {
    guard !descriptors.isEmpty, buffer.count > 0 else { return try sendAll(fd, buffer) }
    if SimulatedKernel.isSimulated(fd) { return try simulatedWriteAll("sendmsg", fd, buffer, descriptors: descriptors) }
    let first = try retryingEINTR("sendmsg", detail: "fd \(fd), \(descriptors.count) descriptor(s)") {
        descriptors.withUnsafeBufferPointer { fds in
            sdk_send_with_fds(fd, buffer.baseAddress, buffer.count, fds.baseAddress, Int32(fds.count), 0)
        }
    }
    if first < buffer.count { try sendAll(fd, UnsafeRawBufferPointer(rebasing: buffer[first...])) }
}

/// Bytes the peer of socket `fd` wrote that this end has not read yet (FIONREAD); -1 if the kernel will not say.
public func unreadInputBytes(_ fd: Int32) -> Int {
    if SimulatedKernel.isSimulated(fd) { return kernel(fd).unreadInput(fd) }
    var bytes: Int32 = 0
    return ioctl(fd, UInt(FIONREAD), &bytes) == 0 ? Int(bytes) : -1
}

/// Bytes written to socket `fd` that its peer has not read yet (SIOCOUTQ); -1 if the kernel will not say.
public func unreadOutputBytes(_ fd: Int32) -> Int {
    if SimulatedKernel.isSimulated(fd) { return kernel(fd).unreadOutput(fd) }
    return Int(sdk_unread_output_bytes(fd))
}

// MARK: Simulated descriptors (SimulatedKernel.swift)

@inline(never)
func kernel(_ fd: Int32) -> SimulatedKernel {
    guard let kernel = SimulatedKernel.current else { fatalError("fd \(fd) is a simulated descriptor, and no simulation runs") }
    return kernel
}

/// A simulated call's result (a count, or -errno) as the wrappers return a real one's.
@inline(never)
func simulatedResult(_ operation: String, _ fd: Int32, reading: Bool = false, _ n: Int) throws(SystemError) -> IOResult {
    if n > 0 { return .bytes(n) }
    if n == 0 { return reading ? .endOfFile : .bytes(0) }
    if n == -Int(EAGAIN) { return .wouldBlock }
    checkBadDescriptor(Int32(-n), operation)
    throw SystemError(operation, errno: Int32(-n), detail: "simulated fd \(fd)")
}

@inline(never)
func simulatedWriteAll(_ operation: String, _ fd: Int32, _ buffer: UnsafeRawBufferPointer, descriptors: [Int32]) throws(SystemError) {
    var offset = 0
    var carried = descriptors
    while offset < buffer.count {
        // A blocking write that would wait: nothing else runs in a simulation to make room, so it is an error.
        guard case .bytes(let n) = try simulatedResult(operation, fd,
                                                       kernel(fd).send(fd, UnsafeRawBufferPointer(rebasing: buffer[offset...]), descriptors: carried)),
            n > 0
        else { throw SystemError(operation, errno: EAGAIN, detail: "simulated fd \(fd) is full") }
        offset += n
        carried = []
    }
}

/// Where `struct dirent`'s name starts within an entry.
private let direntNameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!

/// The name of a `readdir` entry, read where it lies. Loading `entry.pointee` would copy all of `struct dirent`
/// (280 bytes), but the kernel's record is only as long as its name needs: for the last entry in glibc's buffer
/// the copy can run into an unmapped page, and it did once (a SIGSEGV in the orphan sweep of a test run).
public func withDirectoryEntryName<R>(_ entry: UnsafeMutablePointer<dirent>, _ body: (UnsafeRawBufferPointer) -> R) -> R {
    let start = UnsafeRawPointer(entry) + direntNameOffset
    let length = strlen(start.assumingMemoryBound(to: CChar.self))
    return body(UnsafeRawBufferPointer(start: start, count: length))
}

/// A closure handed to a new thread.
private final class ThreadBody {
    let name: String
    let body: () -> Void
    init(name: String, body: @escaping () -> Void) {
        self.name = name
        self.body = body
    }
}

/// Starts a detached thread that names itself `name` and runs `body`. Returns pthread_create's
/// result: 0, or an errno value (no thread, and `body` is released unrun).
func startDetachedThread(named name: String, _ body: @escaping () -> Void) -> Int32 {
    let box = Unmanaged.passRetained(ThreadBody(name: name, body: body)).toOpaque()
    var thread = pthread_t()
    let rc = pthread_create(&thread, nil, { arg in
        let thread = Unmanaged<ThreadBody>.fromOpaque(arg!).takeRetainedValue()
        _ = sdk_set_thread_name(thread.name)
        thread.body()
        return nil
    }, box)
    if rc == 0 {
        pthread_detach(thread)
    } else {
        Unmanaged<ThreadBody>.fromOpaque(box).release()
    }
    return rc
}

extension Array where Element == UInt8 {
    /// `count` bytes left as they are until written: a buffer that reads fill, without zeroing it first (zeroing a
    /// connection's 16 KiB read buffer cost more than its first reads).
    package init(uninitializedCount count: Int) {
        self.init(unsafeUninitializedCapacity: count) { _, initialized in initialized = count }
    }
}
