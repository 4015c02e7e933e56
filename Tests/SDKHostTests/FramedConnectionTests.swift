// FramedConnection on a simulated socket pair and a driven loop: what a connection keeps of the frames it read.
import HostTestSupport
@testable import SDKHost
import SDKPosix
import SDKWire
import Testing

@Suite struct FramedConnectionTests {
    /// A connection that keeps payloads (the daemon's, to forward them) holds each while its message is delivered,
    /// and lets go of a large one afterwards: it held the last frame, up to the frame limit, for as long as the
    /// peer stayed connected and sent nothing more, charged to nothing.
    @Test func aLargePayloadIsLetGoOnceItsMessageIsDelivered() throws {
        let kernel = SimulatedKernel(capacity: 8 << 20)
        SimulatedKernel.current = kernel
        defer { SimulatedKernel.current = nil }
        let loop = try EventLoop(name: "framed-connection", clock: ManualClock(), driven: true)
        let (ours, peer) = kernel.socketPair()
        // The loop is driven on this thread: what its closures touch is this thread's.
        final class Seen: @unchecked Sendable {
            let connection: FramedConnection
            var messages = 0, keptWhileDelivered = 0
            init(_ connection: FramedConnection) { self.connection = connection }
        }
        let seen = Seen(FramedConnection(FileDescriptor(adopting: ours), loop: loop, limits: .default))
        let connection = seen.connection
        connection.keepsPayloads = true
        loop.execute {
            try? seen.connection.start(onMessage: { _ in
                seen.messages += 1
                seen.keptWhileDelivered = seen.connection.withForwardablePayload { $0?.count ?? 0 }
            }, onEnd: { _ in })
        }
        loop.runUntilIdle()
        let big = [UInt8](repeating: 7, count: 2 << 20)
        var frames = try Frame.encode(Message.complete(id: RequestID(), items: [ExtensionItem(title: "big", attachments: [.data(big)])]).plist)
        frames += try Frame.encode(Message.complete(id: RequestID(), items: [ExtensionItem(title: "small")]).plist)
        frames += try Frame.encode(Message.complete(id: RequestID(), items: [ExtensionItem(title: "big", attachments: [.data(big)])]).plist)
        var sent = 0
        while sent < frames.count {
            let n = frames.withUnsafeBytes { kernel.send(peer, UnsafeRawBufferPointer(rebasing: $0[sent...]), descriptors: []) }
            try #require(n > 0)
            sent += n
            loop.runUntilIdle()
        }
        #expect(seen.messages == 3)
        #expect(seen.keptWhileDelivered > 2 << 20, "the payload is there while its message is delivered")
        #expect(connection.keptPayloadCapacity <= FramedConnection.retainedPayloadCapacity,
                "\(connection.keptPayloadCapacity) bytes kept after delivery")
        loop.execute { seen.connection.close() }
        FileDescriptor(adopting: peer).close()
        loop.stop()
        loop.runUntilIdle()
        #expect(kernel.openCount == 0, "left open: \(kernel.openDescriptors)")
    }
}
