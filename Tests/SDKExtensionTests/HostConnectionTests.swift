// HostConnection (the worker's side of the socket): a handler thread's big reply does not hold up what the
// reader thread sends meanwhile (its pongs), because it is encoded before the outbox is locked.
@testable import SDKExtension
import SDKWire
import Dispatch
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct HostConnectionTests {
    static func now() -> UInt64 {
        var t = timespec()
        clock_gettime(CLOCK_MONOTONIC, &t)
        return UInt64(t.tv_sec) * 1_000_000_000 + UInt64(t.tv_nsec)
    }

    @Test func aPongIsNotHeldUpByAHandlerThreadEncodingABigReply() throws {
        var pair: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
        defer { close(pair[0]) }
        // The host's end: read and drop everything.
        let drained = DispatchSemaphore(value: 0)
        let hostEnd = pair[1]
        DispatchQueue.global().async {
            var buffer = [UInt8](repeating: 0, count: 65536)
            while read(hostEnd, &buffer, buffer.count) > 0 {}
            close(hostEnd)
            drained.signal()
        }
        // Made on this thread: this thread is the connection's reader.
        let connection = HostConnection(fd: pair[0])
        // Just under the frame limit, so that it is encoded and sent whole, which takes a while. (One over the limit
        // is refused from its size alone now, before anything is copied: no longer a slow reply.)
        let reply = Message.complete(id: RequestID(), items: [ExtensionItem(attachments: [.data([UInt8](repeating: 7, count: (16 << 20) - (64 << 10)))])])
        let started = DispatchSemaphore(value: 0)
        let bigTime = Mutex<UInt64>(0)
        let bigDone = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            started.signal()
            let t0 = Self.now()
            connection.send(reply)
            bigTime.withLock { $0 = Self.now() - t0 }
            bigDone.signal()
        }
        started.wait()
        usleep(2_000)  // the handler thread is encoding now
        let t0 = Self.now()
        connection.send(.pong(seq: 1))
        let pongTime = Self.now() - t0
        bigDone.wait()
        let big = bigTime.withLock { $0 }
        // Before, the pong waited for the whole encoding under the outbox lock.
        #expect(pongTime * 4 < big, "pong took \(pongTime / 1000) µs while the big reply took \(big / 1000) µs")
        shutdown(pair[0], Int32(SHUT_WR))
        #expect(drained.wait(timeout: .now() + 30) == .success)
    }
}
