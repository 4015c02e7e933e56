// SimulatedKernel: the simulation's in-memory sockets, pipes and counters behave as Linux's do where the engine
// can tell: short sends and EAGAIN at capacity, descriptors duplicated on the way and read with the first byte
// of their message (a read stops after them), a reset for a peer that closed with bytes unread, end of file
// and hang-up after a close, EPIPE to a closed peer, and descriptors left unread closed with the socket. And the
// wrappers the engine calls (receive, send, close, a driven EventLoop's watch) take simulated numbers to it.
// Each test is synchronous: a kernel is current on one thread.
import HostTestSupport
@testable import SDKPosix
import CSDKShim
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct SimulatedKernelTests {
    /// Runs `body` with a new kernel current on this thread; expects it to end with nothing open.
    func withKernel(capacity: Int = 64, _ body: (SimulatedKernel) throws -> Void) rethrows {
        let kernel = SimulatedKernel(capacity: capacity)
        SimulatedKernel.current = kernel
        defer { SimulatedKernel.current = nil }
        try body(kernel)
        #expect(kernel.openCount == 0, "left open: \(kernel.openDescriptors)")
    }

    func send(_ fd: Int32, _ bytes: [UInt8], descriptors: [Int32] = []) throws -> IOResult {
        try bytes.withUnsafeBytes { try sendNonBlocking(fd, $0, descriptors: descriptors) }
    }

    func receive(_ fd: Int32, max: Int = 256) throws -> (IOResult, [UInt8], [Int32], Bool) {
        var buffer = [UInt8](repeating: 0, count: max)
        var descriptors: [Int32] = []
        var truncated = false
        let result = try buffer.withUnsafeMutableBytes { try receiveNonBlocking(fd, into: $0, descriptors: &descriptors, truncated: &truncated) }
        if case .bytes(let n) = result { return (result, Array(buffer[..<n]), descriptors, truncated) }
        return (result, [], descriptors, truncated)
    }

    @Test func aSocketPairCarriesBytesBothWaysAndFillsUp() throws {
        try withKernel(capacity: 10) { (kernel: SimulatedKernel) throws in
            let (a, b) = kernel.socketPair()
            #expect(SimulatedKernel.isSimulated(a) && SimulatedKernel.isSimulated(b))
            #expect(try receive(b).0 == .wouldBlock)
            #expect(kernel.readiness(b) & SDK_EPOLLIN == 0)
            #expect(try send(a, Array(1...6)) == .bytes(6))
            #expect(try send(a, Array(7...12)) == .bytes(4), "only what fits in the peer's room")
            #expect(try send(a, [13]) == .wouldBlock)
            #expect(kernel.readiness(a) & SDK_EPOLLOUT == 0)
            #expect(unreadOutputBytes(a) == 10)
            #expect(kernel.readiness(b) & SDK_EPOLLIN != 0)
            let (result, bytes, _, _) = try receive(b, max: 8)
            #expect(result == .bytes(8))
            #expect(bytes == Array(1...8))
            #expect(unreadOutputBytes(a) == 2)
            #expect(kernel.readiness(a) & SDK_EPOLLOUT != 0)
            #expect(try receive(b).1 == [9, 10])
            #expect(try send(b, [42]) == .bytes(1))
            #expect(try receive(a).1 == [42])
            FileDescriptor(adopting: a).close()
            FileDescriptor(adopting: b).close()
        }
    }

    @Test func descriptorsArriveDuplicatedWithTheirFirstByteAndAReadStopsAfterThem() throws {
        try withKernel { (kernel: SimulatedKernel) throws in
            let (a, b) = kernel.socketPair()
            var pipe: [Int32] = [-1, -1]
            #expect(sdk_pipe_cloexec(&pipe) == 0)
            #expect(try send(a, [1, 2]) == .bytes(2))
            #expect(try send(a, [3, 4], descriptors: [pipe[1]]) == .bytes(2))
            #expect(try send(a, [5]) == .bytes(1))
            // The sender's descriptor is its own still: closing it leaves the copy in flight open.
            Glibc.close(pipe[1])
            // A read takes the bytes before those that brought a descriptor too, and the descriptor with them; it
            // stops after them.
            let first = try receive(b)
            #expect(first.1 == [1, 2, 3, 4])
            #expect(first.2.count == 1)
            let received = try #require(first.2.first)
            #expect(received != pipe[1], "a copy, made while the sender's was open")
            var byte: UInt8 = 7
            #expect(write(received, &byte, 1) == 1, "the received descriptor is the pipe's write end")
            var back: UInt8 = 0
            #expect(read(pipe[0], &back, 1) == 1 && back == 7)
            Glibc.close(received)
            Glibc.close(pipe[0])
            #expect(try receive(b).1 == [5])
            FileDescriptor(adopting: a).close()
            FileDescriptor(adopting: b).close()
        }
    }

    @Test func descriptorsPastTheLimitAreClosedAndTheReadSaysSo() throws {
        try withKernel { (kernel: SimulatedKernel) throws in
            let (a, b) = kernel.socketPair()
            let counters = (0..<3).map { _ in kernel.counter() }
            #expect(try send(a, [1], descriptors: counters) == .bytes(1))
            for fd in counters { kernel.close(fd) }
            var buffer = [UInt8](repeating: 0, count: 8)
            var received: [Int32] = []
            var truncated = false
            let n = buffer.withUnsafeMutableBytes { kernel.receive(b, into: $0, descriptors: &received, maxDescriptors: 2, truncated: &truncated) }
            #expect(n == 1)
            #expect(received.count == 2)
            #expect(truncated)
            for fd in received { kernel.close(fd) }
            kernel.close(a)
            kernel.close(b)
        }
    }

    @Test func aPeerThatClosesWithBytesUnreadResetsTheOther() throws {
        try withKernel { (kernel: SimulatedKernel) throws in
            let (a, b) = kernel.socketPair()
            #expect(try send(a, [1]) == .bytes(1))
            #expect(try send(b, [9, 9]) == .bytes(2))
            // b closes with a's byte unread: a first reads what b sent, then the reset, then end of file.
            kernel.close(b)
            let events = kernel.readiness(a)
            #expect(events & SDK_EPOLLIN != 0 && events & SDK_EPOLLRDHUP != 0 && events & EventLoop.hangUp != 0)
            #expect(try receive(a).1 == [9, 9])
            #expect(throws: SystemError.self) { try receive(a) }
            #expect(try receive(a).0 == .endOfFile)
            #expect(throws: SystemError.self) { try send(a, [2]) }
            kernel.close(a)
        }
    }

    @Test func aPeerThatClosesAfterReadingEverythingIsEndOfFile() throws {
        try withKernel { (kernel: SimulatedKernel) throws in
            let (a, b) = kernel.socketPair()
            #expect(try send(b, [4]) == .bytes(1))
            kernel.close(b)
            #expect(try receive(a).1 == [4])
            #expect(try receive(a).0 == .endOfFile)
            kernel.close(a)
        }
    }

    @Test func descriptorsLeftUnreadCloseWithTheSocket() throws {
        try withKernel { (kernel: SimulatedKernel) throws in
            let (a, b) = kernel.socketPair()
            var pipe: [Int32] = [-1, -1]
            #expect(sdk_pipe_cloexec(&pipe) == 0)
            try setNonBlocking(pipe[0])
            #expect(try send(a, [1], descriptors: [pipe[1]]) == .bytes(1))
            Glibc.close(pipe[1])
            var byte: UInt8 = 0
            #expect(read(pipe[0], &byte, 1) == -1 && errno == EAGAIN, "the copy in flight keeps the pipe open")
            kernel.close(b)
            #expect(read(pipe[0], &byte, 1) == 0, "closed with the socket that never read it: the pipe has no writer")
            Glibc.close(pipe[0])
            kernel.close(a)
        }
    }

    @Test func pipesAndCountersReadAsTheirKernelKinds() throws {
        try withKernel { (kernel: SimulatedKernel) throws in
            let (r, w) = kernel.pipe()
            var buffer = [UInt8](repeating: 0, count: 8)
            #expect(try buffer.withUnsafeMutableBytes { try readNonBlocking(r, into: $0) } == .wouldBlock)
            #expect(try [UInt8]([1, 2, 3]).withUnsafeBytes { try sendNonBlocking(w, $0) } == .bytes(3))
            #expect(try buffer.withUnsafeMutableBytes { try readNonBlocking(r, into: $0) } == .bytes(3))
            FileDescriptor(adopting: w).close()
            #expect(kernel.readiness(r) & EventLoop.hangUp != 0)
            #expect(try buffer.withUnsafeMutableBytes { try readNonBlocking(r, into: $0) } == .endOfFile)
            FileDescriptor(adopting: r).close()

            let counter = kernel.counter()
            #expect(kernel.readiness(counter) & SDK_EPOLLIN == 0)
            _ = withUnsafeBytes(of: UInt64(2)) { kernel.send(counter, $0, descriptors: []) }
            #expect(kernel.readiness(counter) & SDK_EPOLLIN != 0)
            #expect(try buffer.withUnsafeMutableBytes { try readNonBlocking(counter, into: $0) } == .bytes(8))
            #expect(buffer.withUnsafeBytes { $0.load(as: UInt64.self) } == 2)
            #expect(kernel.readiness(counter) & SDK_EPOLLIN == 0)
            kernel.close(counter)
        }
    }

    @Test func aDrivenLoopWatchesSimulatedDescriptors() throws {
        final class Seen: @unchecked Sendable {
            var events: [UInt32] = []
            var registered = false
            var ended = false
        }
        try withKernel { (kernel: SimulatedKernel) throws in
            let loop = try EventLoop(name: "simulated", clock: ManualClock(), driven: true)
            let (a, b) = kernel.socketPair()
            let seen = Seen()
            loop.execute {
                do {
                    try loop.register(b, events: EventLoop.readable) { events in
                        seen.events.append(events)
                        var none: [Int32] = [], truncated = false
                        var buffer = [UInt8](repeating: 0, count: 16)
                        let result = try? buffer.withUnsafeMutableBytes {
                            try receiveNonBlocking(b, into: $0, descriptors: &none, truncated: &truncated)
                        }
                        if result == .endOfFile {
                            // Level-triggered: a closed peer stays readable until it is unwatched.
                            loop.unregister(b)
                            FileDescriptor(adopting: b).close()
                            seen.ended = true
                        }
                    }
                    seen.registered = true
                } catch {}
            }
            loop.runUntilIdle()
            #expect(seen.registered)
            #expect(seen.events.isEmpty, "nothing to read yet")
            #expect(try send(a, [1, 2]) == .bytes(2))
            loop.runUntilIdle()
            #expect(seen.events.count == 1 && seen.events.first.map { $0 & SDK_EPOLLIN != 0 } == true)
            FileDescriptor(adopting: a).close()
            loop.runUntilIdle()
            #expect(seen.ended)
            #expect(seen.events.last.map { $0 & SDK_EPOLLRDHUP != 0 } == true)
            loop.stop()
            loop.runUntilIdle()
        }
    }
}
