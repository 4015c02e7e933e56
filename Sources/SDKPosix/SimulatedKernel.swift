// SimulatedKernel: in-memory stand-ins for the descriptors a worker's or a daemon client's connection uses
// (stream socket pairs that carry descriptors, pipes, event counters), for the engine's simulation
// (sdk-host-simulate). Each syscall on a real descriptor costs a microsecond or more; a schedule makes about
// two thousand of them, which capped the simulation at a tenth of its target speed. swift-system's
// MockingDriver has the idea: the code under test keeps calling its usual wrappers, and the wrappers hand a
// simulated descriptor to the simulation instead of the kernel.
//
// A simulated descriptor is a number at or above `SimulatedKernel.firstDescriptor` (2^30) on a thread where a
// simulation runs (`current`). The kernel could hand out such a number only with fs.nr_open and RLIMIT_NOFILE both
// raised past a billion (their defaults are 2^20 and 1024); even then it is taken for a simulated one only on a
// simulation's thread. The wrappers in Syscalls.swift, FileDescriptor.close and EventLoop test the number and do
// nothing else differently: for a real descriptor the test is one compare against a constant.
//
// What it models, after Linux's unix stream sockets: a send is queued as one segment with the descriptors it
// carries (duplicated, as SCM_RIGHTS does) and fails with EAGAIN once the peer holds `capacity` bytes unread; a
// read takes whole or partial segments and stops after the first segment that carries descriptors (which it
// takes with that segment's first byte, after any bytes it read before it), as unix_stream_read_generic does; closing an end with bytes unread makes the
// peer's next read fail with ECONNRESET once its queue is empty; a closed peer reads as end of file and polls as
// EPOLLIN | EPOLLRDHUP | EPOLLHUP; sending to one fails with EPIPE. A pipe is a one-way stream without
// descriptors; a counter reads as eventfd does. A kernel belongs to the one thread it is `current` on.

#if canImport(Glibc)
import Glibc
#endif
import CSDKShim

package final class SimulatedKernel: @unchecked Sendable {
    // @unchecked Sendable: used only on the thread it is `current` on.

    /// The first simulated descriptor number.
    package static let firstDescriptor: Int32 = 1 << 30

    /// Whether `fd` is a simulated descriptor.
    @inline(__always)
    package static func isSimulated(_ fd: Int32) -> Bool { fd >= firstDescriptor && current != nil }

    /// The kernel the calling thread's simulated descriptors belong to, set by a simulation for the length of a
    /// schedule. Per thread (a C thread-local the setter retains): simulations (and tests) on other threads have
    /// kernels of their own.
    package static var current: SimulatedKernel? {
        @inline(__always) get { sdk_simulated_kernel_get().map { Unmanaged<SimulatedKernel>.fromOpaque($0).takeUnretainedValue() } }
        set {
            let old = sdk_simulated_kernel_get()
            sdk_simulated_kernel_set(newValue.map { Unmanaged.passRetained($0).toOpaque() })
            if let old { Unmanaged<SimulatedKernel>.fromOpaque(old).release() }
        }
    }

    /// Bytes a peer may hold unread before a send fails with EAGAIN.
    package let capacity: Int

    // The channels' and ends' fields are not checked for exclusive access at run time either, for the reason
    // `table` gives: `readiness` reads them for every watched descriptor at every turn, on the kernel's one
    // thread, and no access to them calls out.

    /// One direction of a socket pair or pipe.
    final class Channel {
        struct Segment {
            var bytes: [UInt8]
            var offset = 0
            /// Owned by the channel until read (then by the reader) or closed.
            var descriptors: [Int32]
        }
        @exclusivity(unchecked) var segments = Deque<Segment>()
        @exclusivity(unchecked) var unread = 0
        @exclusivity(unchecked) var writerClosed = false
        @exclusivity(unchecked) var readerClosed = false
        /// The writer closed with bytes of the reader's unread: the reader's next read past its queue fails.
        @exclusivity(unchecked) var reset = false
    }

    final class Endpoint {
        enum Kind { case socket, pipeReader, pipeWriter, counter }
        let kind: Kind
        let inbound: Channel?
        let outbound: Channel?
        @exclusivity(unchecked) var counter: UInt64 = 0
        @exclusivity(unchecked) var references = 1
        init(_ kind: Kind, inbound: Channel?, outbound: Channel?) {
            self.kind = kind
            self.inbound = inbound
            self.outbound = outbound
        }
    }

    /// The open ends by descriptor, from `firstDescriptor` on: a kernel never reuses a number, so a slot is the
    /// descriptor's for good (an array: the loop asks every watched descriptor's readiness at every turn).
    /// Not checked for exclusive access at run time: the loop asks it for every watched descriptor at every turn
    /// (the check cost more than the lookup), and the kernel is confined to one thread, where no access to it
    /// overlaps another (none calls out while it holds one).
    @exclusivity(unchecked) private var table: [Endpoint?] = []
    @exclusivity(unchecked) private var nextDescriptor = SimulatedKernel.firstDescriptor

    package init(capacity: Int = 32 * 1024) {
        self.capacity = capacity
    }

    /// Simulated descriptors open now (a schedule ends with none).
    @exclusivity(unchecked) package private(set) var openCount = 0

    /// The open simulated descriptors, for a failure's report.
    package var openDescriptors: [Int32] { table.indices.filter { table[$0] != nil }.map { Self.firstDescriptor + Int32($0) } }

    /// Whether `fd` is open.
    package func isOpen(_ fd: Int32) -> Bool { lookup(fd) != nil }

    /// `fd`'s open end, or nil.
    @inline(__always)
    private func lookup(_ fd: Int32) -> Endpoint? {
        let slot = Int(fd) - Int(Self.firstDescriptor)
        return slot >= 0 && slot < table.count ? table[slot] : nil
    }

    private func install(_ endpoint: Endpoint) -> Int32 {
        let fd = nextDescriptor
        nextDescriptor += 1
        table.append(endpoint)
        openCount += 1
        return fd
    }

    private func endpoint(_ fd: Int32, _ operation: String) -> Endpoint {
        guard let endpoint = lookup(fd) else { fatalError("\(operation): simulated descriptor \(fd) is not open — a descriptor bug") }
        return endpoint
    }

    // MARK: Making descriptors

    /// A connected pair of stream sockets (socketpair(AF_UNIX, SOCK_STREAM)).
    package func socketPair() -> (Int32, Int32) {
        let ab = Channel(), ba = Channel()
        return (install(Endpoint(.socket, inbound: ba, outbound: ab)), install(Endpoint(.socket, inbound: ab, outbound: ba)))
    }

    /// A pipe: its read end, then its write end.
    package func pipe() -> (read: Int32, write: Int32) {
        let channel = Channel()
        return (install(Endpoint(.pipeReader, inbound: channel, outbound: nil)),
                install(Endpoint(.pipeWriter, inbound: nil, outbound: channel)))
    }

    /// A counter that reads as an eventfd: readable while non-zero.
    package func counter() -> Int32 { install(Endpoint(.counter, inbound: nil, outbound: nil)) }

    /// Another descriptor for the same end (dup(2)); the end closes with its last descriptor.
    package func duplicate(_ fd: Int32) -> Int32 {
        let endpoint = endpoint(fd, "dup")
        endpoint.references += 1
        return install(endpoint)
    }

    // MARK: Syscalls

    /// close(2).
    package func close(_ fd: Int32) {
        guard let endpoint = lookup(fd) else {
            fatalError("close(\(fd)): EBADF — a simulated descriptor closed twice or never open")
        }
        table[Int(fd) - Int(Self.firstDescriptor)] = nil
        openCount -= 1
        endpoint.references -= 1
        guard endpoint.references == 0 else { return }
        if let inbound = endpoint.inbound {
            inbound.readerClosed = true
            if inbound.unread > 0, let peerOutbound = endpoint.kind == .socket ? endpoint.outbound : nil {
                // Linux: closing a socket with unread data resets its peer.
                peerOutbound.reset = true
            }
            while let segment = inbound.segments.popFirst() { closeAll(segment.descriptors) }
            inbound.unread = 0
        }
        endpoint.outbound?.writerClosed = true
    }

    private func closeAll(_ descriptors: [Int32]) {
        for fd in descriptors {
            if Self.isSimulated(fd) { close(fd) } else { _ = Glibc.close(fd) }
        }
    }

    /// recvmsg(2) / read(2): bytes into `buffer`, descriptors (at most `maxDescriptors`, the rest closed and
    /// `truncated` set) appended to `descriptors`. Returns the count, 0 at end of file, or -errno.
    package func receive(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, descriptors: inout [Int32],
                         maxDescriptors: Int, truncated: inout Bool) -> Int
    {
        let endpoint = endpoint(fd, "recvmsg")
        if endpoint.kind == .counter {
            guard buffer.count >= 8 else { return -Int(EINVAL) }
            guard endpoint.counter > 0 else { return -Int(EAGAIN) }
            buffer.storeBytes(of: endpoint.counter, as: UInt64.self)
            endpoint.counter = 0
            return 8
        }
        guard let channel = endpoint.inbound else { return -Int(EBADF) }
        var copied = 0
        while copied < buffer.count, var segment = channel.segments.first {
            let n = min(buffer.count - copied, segment.bytes.count - segment.offset)
            segment.bytes.withUnsafeBytes { raw in
                (buffer.baseAddress! + copied).copyMemory(from: raw.baseAddress! + segment.offset, byteCount: n)
            }
            copied += n
            segment.offset += n
            channel.unread -= n
            let carried = segment.descriptors
            segment.descriptors = []
            if segment.offset == segment.bytes.count {
                _ = channel.segments.popFirst()
            } else {
                channel.segments.withFirst { $0 = segment }
            }
            if !carried.isEmpty {
                descriptors.append(contentsOf: carried.prefix(maxDescriptors))
                if carried.count > maxDescriptors {
                    truncated = true
                    closeAll(Array(carried[maxDescriptors...]))
                }
                break
            }
        }
        if copied > 0 || buffer.count == 0 { return copied }
        if channel.reset {
            channel.reset = false
            return -Int(ECONNRESET)
        }
        return channel.writerClosed ? 0 : -Int(EAGAIN)
    }

    /// sendmsg(2) / write(2): queues what fits of `buffer` for the peer, with `descriptors` (duplicated) on its
    /// first byte. Returns the count or -errno.
    package func send(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, descriptors: [Int32]) -> Int {
        let endpoint = endpoint(fd, "sendmsg")
        if endpoint.kind == .counter {
            guard buffer.count == 8 else { return -Int(EINVAL) }
            endpoint.counter &+= buffer.load(as: UInt64.self)
            return 8
        }
        guard let channel = endpoint.outbound else { return -Int(EBADF) }
        if channel.readerClosed { return -Int(EPIPE) }
        let n = min(buffer.count, capacity - channel.unread)
        guard n > 0 else { return buffer.count == 0 ? 0 : -Int(EAGAIN) }
        var carried: [Int32] = []
        for fd in descriptors {
            if Self.isSimulated(fd) {
                carried.append(duplicate(fd))
            } else {
                let copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
                if copy < 0 {
                    let e = errno
                    closeAll(carried)
                    return -Int(e)
                }
                carried.append(copy)
            }
        }
        channel.segments.append(Channel.Segment(bytes: Array(UnsafeRawBufferPointer(rebasing: buffer[..<n])), descriptors: carried))
        channel.unread += n
        return n
    }

    /// Bytes the peer sent that this end has not read (FIONREAD).
    package func unreadInput(_ fd: Int32) -> Int { endpoint(fd, "ioctl(FIONREAD)").inbound?.unread ?? 0 }

    /// Bytes this end sent that its peer has not read (SIOCOUTQ).
    package func unreadOutput(_ fd: Int32) -> Int { endpoint(fd, "ioctl(SIOCOUTQ)").outbound?.unread ?? 0 }

    /// What epoll would report for `fd` now (level-triggered), before masking with what is watched.
    @inline(__always)
    package func readiness(_ fd: Int32) -> UInt32 {
        guard let endpoint = lookup(fd) else { return 0 }
        let readable = SDK_EPOLLIN, writable = SDK_EPOLLOUT, peerClosed = SDK_EPOLLRDHUP
        let hangUp: UInt32 = 0x10, error: UInt32 = 0x08
        switch endpoint.kind {
        case .counter:
            return (endpoint.counter > 0 ? readable : 0) | writable
        case .pipeReader:
            let channel = endpoint.inbound!
            return (channel.unread > 0 || channel.writerClosed ? readable : 0) | (channel.writerClosed ? hangUp : 0)
        case .pipeWriter:
            let channel = endpoint.outbound!
            return channel.readerClosed ? error | writable : (channel.unread < capacity ? writable : 0)
        case .socket:
            let inbound = endpoint.inbound!, outbound = endpoint.outbound!
            var events: UInt32 = 0
            if inbound.unread > 0 || inbound.writerClosed || inbound.reset { events |= readable }
            if inbound.writerClosed { events |= peerClosed | hangUp }
            if inbound.reset { events |= error }
            if outbound.readerClosed || outbound.unread < capacity { events |= writable }
            return events
        }
    }
}

/// What a driven EventLoop watches on simulated descriptors, in descriptor order (so that readiness is reported
/// in an order that does not depend on hashing), and where its next scan starts. Loop-confined, as the loop's
/// handlers are.
struct SimulatedWatchList {
    private var interest: [(fd: Int32, events: UInt32)] = []
    /// After the last descriptor a full turn reported: more than 64 ready descriptors take turns, as epoll's
    /// ready list does.
    private var scanAfter: Int32 = -1

    var isEmpty: Bool { interest.isEmpty }

    /// epoll_ctl(ADD).
    mutating func add(_ fd: Int32, _ events: UInt32) throws(SystemError) {
        let at = interest.firstIndex { $0.fd >= fd } ?? interest.endIndex
        guard at == interest.endIndex || interest[at].fd != fd else {
            throw SystemError("epoll_ctl(ADD)", errno: EEXIST, detail: "simulated fd \(fd)")
        }
        interest.insert((fd, events), at: at)
    }

    /// epoll_ctl(MOD).
    mutating func modify(_ fd: Int32, _ events: UInt32) throws(SystemError) {
        guard let at = interest.firstIndex(where: { $0.fd == fd }) else {
            throw SystemError("epoll_ctl(MOD)", errno: ENOENT, detail: "simulated fd \(fd)")
        }
        interest[at].events = events
    }

    /// epoll_ctl(DEL).
    mutating func remove(_ fd: Int32) { interest.removeAll { $0.fd == fd } }

    /// Appends the descriptors that are ready for what they are watched for (and `hangUp`, which epoll always
    /// reports) to the `count` real ones in `fds` and `events`, in descriptor order from where the last full turn
    /// stopped; returns the new count. At most `fds.count` in all, as epoll_wait's: the rest are ready again next
    /// turn (level-triggered), and go first then.
    mutating func ready(into fds: inout [Int32], _ events: inout [UInt32], after count: Int, hangUp: UInt32) -> Int32 {
        guard let kernel = SimulatedKernel.current else { return Int32(count) }
        var n = count
        let limit = fds.count
        let start = scanAfter < 0 ? 0 : interest.firstIndex { $0.fd > scanAfter } ?? 0
        // From `start` to the end, then from the first up to `start` (no division per descriptor).
        interest.withUnsafeBufferPointer { watched in
            fds.withUnsafeMutableBufferPointer { fds in
                events.withUnsafeMutableBufferPointer { events in
                    for pass in 0..<2 {
                        for i in pass == 0 ? start..<watched.count : 0..<start where n < limit {
                            let ready = kernel.readiness(watched[i].fd) & (watched[i].events | hangUp)
                            if ready != 0 {
                                fds[n] = watched[i].fd
                                events[n] = ready
                                n += 1
                            }
                        }
                    }
                }
            }
        }
        scanAfter = n == limit ? fds[n - 1] : -1
        return Int32(n)
    }
}
