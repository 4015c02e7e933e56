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
        try withSocketPair(capacity: 8 << 20) { kernel, loop, ours, peer in
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
        }
    }
    /// Marked frames (the host's answers to a worker's calls) are counted while they wait in this process, the
    /// kernel's buffer to the peer full: not when the peer reads, however long it goes on, and each one when it
    /// stops (the host ends a worker that piles up answers this way).
    @Test func markedFramesAreCountedWhileTheyWaitForThePeerToRead() throws {
        try withSocketPair(capacity: 4096) { kernel, loop, ours, peer in
            // The loop is driven on this thread: what its closures touch is this thread's.
            final class Box: @unchecked Sendable { var connection: FramedConnection?; var counted: [Int] = [] }
            let box = Box()
            box.connection = FramedConnection(FileDescriptor(adopting: ours), loop: loop, limits: .default)
            let connection = try #require(box.connection)
            loop.execute { try? box.connection?.start(onMessage: { _ in }, onEnd: { _ in }) }
            loop.runUntilIdle()
            let answer = Message.hostCallError(id: RequestID(), call: 1, error: .serviceNotAllowed(String(repeating: "s", count: 1024)))
            /// Sends and marks one answer on the loop, as the engine does, and counts what waits after the flush.
            func answerOnce() {
                loop.execute {
                    try? box.connection!.send(answer)
                    box.connection!.markLastFrame()
                }
                loop.runUntilIdle()
                loop.execute { box.counted.append(box.connection!.markedFramesQueued) }
                loop.runUntilIdle()
            }
            let reader = PeerReader(kernel, loop, peer)
            func peerReads(_ bytes: Int) { reader.read(bytes) }
            // A peer that keeps up, 2 KiB read for each answer of ~1.1 KB, for 5,000 answers: at most a few wait,
            // although the kernel's buffer is never empty for long.
            for _ in 0..<5_000 {
                answerOnce()
                peerReads(2048)
            }
            #expect(box.counted.max()! <= 4, "\(box.counted.max()!) answers waited for a peer that keeps up")
            // The peer stops reading: once the kernel's 4 KiB are full, each answer waits, one more each time.
            box.counted = []
            for _ in 0..<10 { answerOnce() }
            let counted = box.counted
            #expect(connection.pendingOutputBytes > 0)
            let first = try #require(counted.firstIndex { $0 > 0 })
            #expect(Array(counted[first...]) == Array(1...(counted.count - first)), "\(counted)")
            // It reads everything: nothing waits.
            for _ in 0..<100 where connection.pendingOutputBytes > 0 || kernel.unreadOutput(ours) > 0 { peerReads(64 << 10) }
            #expect(connection.pendingOutputBytes == 0)
            box.counted = []
            answerOnce()
            #expect(box.counted == [0])
            loop.execute { box.connection?.close() }
            FileDescriptor(adopting: peer).close()
        }
    }
    /// A peer that sends half a frame and closes with something of ours unread: the read after its bytes fails with
    /// ECONNRESET, and the half frame is a truncated frame, as it is at an end of file (it was a broken socket).
    @Test func halfAFrameBeforeAResetIsATruncatedFrame() throws {
        try withSocketPair(capacity: 1 << 20) { kernel, loop, ours, peer in
            final class Box: @unchecked Sendable { var connection: FramedConnection?; var end: ConnectionEnd? }
            let box = Box()
            box.connection = FramedConnection(FileDescriptor(adopting: ours), loop: loop, limits: .default)
            loop.execute {
                try? box.connection?.start(onMessage: { _ in }, onEnd: { box.end = $0 })
                try? box.connection?.send(.ping(seq: 1))  // the peer never reads it
            }
            loop.runUntilIdle()
            let half: [UInt8] = [0, 0, 0, 100] + Array("bplist00xx".utf8)
            #expect(half.withUnsafeBytes { kernel.send(peer, $0, descriptors: []) } == half.count)
            kernel.close(peer)
            loop.runUntilIdle()
            loop.execute { box.connection?.close() }  // does not call `onEnd`
            guard case .truncated(let detail)? = box.end else {
                Issue.record("ended \(String(describing: box.end))")
                return
            }
            #expect(detail.contains("truncated frame"), "\(detail)")
        }
    }

    /// A peer that closes with something of ours unread, at a frame boundary, has simply gone: an end of file,
    /// not a broken socket (a daemon logged a client stopped by Ctrl-C as "dropped: … Connection reset by peer").
    @Test func aResetAtAFrameBoundaryIsAnEndOfFile() throws {
        try withSocketPair(capacity: 1 << 20) { kernel, loop, ours, peer in
            final class Box: @unchecked Sendable { var connection: FramedConnection?; var end: ConnectionEnd?; var got = 0 }
            let box = Box()
            box.connection = FramedConnection(FileDescriptor(adopting: ours), loop: loop, limits: .default)
            loop.execute {
                try? box.connection?.start(onMessage: { _ in box.got += 1 }, onEnd: { box.end = $0 })
                try? box.connection?.send(.ping(seq: 1))  // the peer never reads it
            }
            loop.runUntilIdle()
            var whole: [UInt8] = []
            var outgoing = OutgoingDescriptors()
            var encoder = BinaryPlistEncoder()
            try outgoing.encode(.pong(seq: 1), with: &encoder, appendingTo: &whole)
            #expect(whole.withUnsafeBytes { kernel.send(peer, $0, descriptors: []) } == whole.count)
            kernel.close(peer)
            loop.runUntilIdle()
            loop.execute { box.connection?.close() }
            #expect(box.got == 1)
            #expect(box.end == .endOfFile, "ended \(String(describing: box.end))")
        }
    }

    /// A frame the peer had begun when this side stopped reading (its output to the peer over the limit) does not
    /// age while reading is paused: the time this side would not read is not the peer's, and the time before the
    /// pause still counts. Its clock ran on, so a daemon's sweep closed a client for "a frame left unfinished" as
    /// soon as it had read its replies.
    @Test func aPauseForBackpressureDoesNotCountAgainstAnUnfinishedFrame() throws {
        let clock = ManualClock()
        try withSocketPair(capacity: 4096, clock: clock) { kernel, loop, ours, peer in
            final class Box: @unchecked Sendable { let connection: FramedConnection; init(_ c: FramedConnection) { connection = c } }
            let box = Box(FramedConnection(FileDescriptor(adopting: ours), loop: loop, limits: .default))
            let connection = box.connection
            connection.outputLimit = 2048
            loop.execute { try? box.connection.start(onMessage: { _ in }, onEnd: { _ in }) }
            loop.runUntilIdle()
            let half: [UInt8] = [0, 0, 0, 100] + Array("bplist00xx".utf8)
            #expect(half.withUnsafeBytes { kernel.send(peer, $0, descriptors: []) } == half.count)
            loop.runUntilIdle()
            let began = try #require(connection.partialFrameSince, "the frame is timed from its first bytes")
            clock.advance(by: 3_000_000_000)  // read for 3 s before the pause: those count
            // The peer does not read: the output passes the limit and reading pauses.
            loop.execute { for seq in 0..<400 { try? box.connection.send(.ping(seq: Int64(seq))) } }
            loop.runUntilIdle()
            #expect(connection.outputStalledSince != nil, "the output is over the limit: \(connection.pendingOutputBytes) bytes")
            clock.advance(by: 10_000_000_000)
            // The peer reads everything; the output drains and reading starts again.
            var buffer = [UInt8](repeating: 0, count: 65536)
            var descriptors: [Int32] = [], truncated = false
            for _ in 0..<100 {
                let n = buffer.withUnsafeMutableBytes {
                    kernel.receive(peer, into: $0, descriptors: &descriptors, maxDescriptors: 0, truncated: &truncated)
                }
                loop.runUntilIdle()
                if connection.pendingOutputBytes == 0, n <= 0 { break }
            }
            #expect(connection.outputStalledSince == nil, "\(connection.pendingOutputBytes) bytes still queued")
            #expect(connection.partialFrameSince == began + 10_000_000_000,
                    "aged 3 s (not 13, nor 0: paused, not restarted): \(String(describing: connection.partialFrameSince))")
            loop.execute { box.connection.close() }
            loop.runUntilIdle()
            kernel.close(peer)
        }
    }

    /// The clock of an answer the host waits for (`AnswerClock`: a pong, say) counts only the time the worker's silence is its own: not while
    /// the ping waits here with the worker reading what comes before it, nor while what the worker wrote waits
    /// unread here; it counts while the worker reads nothing, and once the ping is the worker's to answer.
    @Test func anAnswersClockCountsOnlyTheWorkersOwnSilence() throws {
        try withSocketPair(capacity: 4096) { kernel, loop, ours, peer in
            final class Box: @unchecked Sendable { let connection: FramedConnection; init(_ c: FramedConnection) { connection = c } }
            let box = Box(FramedConnection(FileDescriptor(adopting: ours), loop: loop, limits: .default))
            let connection = box.connection
            loop.execute {
                try? box.connection.start(onMessage: { _ in }, onEnd: { _ in })
                // 16 KB queued ahead of the ping: the kernel takes 4 KiB, the rest and the ping wait here.
                try? box.connection.send(.error(message: String(repeating: "x", count: 16_000), id: nil))
                try? box.connection.send(.ping(seq: 1))
            }
            loop.runUntilIdle()
            var clock = AnswerClock(sentAt: 0, connection: connection)
            #expect(connection.bytesWritten < clock.end)
            let reader = PeerReader(kernel, loop, peer)
            func peerReads(_ bytes: Int) { reader.read(bytes) }
            // The worker reads nothing: its silence (1 s).
            clock.look(at: 1_000_000_000, connection: connection)
            #expect(clock.charged == 1_000_000_000)
            // It reads what comes before the ping: the host is behind it (nothing more is charged).
            peerReads(4096)
            clock.look(at: 2_000_000_000, connection: connection)
            #expect(clock.charged == 1_000_000_000)
            // It has read up to the ping: the ping is in the kernel for it, and the time is its own again.
            for _ in 0..<10 where connection.bytesWritten < clock.end { peerReads(4096) }
            #expect(connection.bytesWritten >= clock.end)
            clock.look(at: 3_000_000_000, connection: connection)
            clock.look(at: 4_000_000_000, connection: connection)
            #expect(clock.charged == 2_000_000_000 + 1_000_000_000)
            // What it writes waits unread here (the loop has not run): the host is behind it, whatever it says.
            let frame = try Frame.encode(Message.error(message: "busy", id: nil).plist)
            #expect(frame.withUnsafeBytes { kernel.send(peer, $0, descriptors: []) } == frame.count)
            clock.look(at: 5_000_000_000, connection: connection)
            #expect(clock.charged == 3_000_000_000)
            // Read, it is the worker's time again.
            loop.runUntilIdle()
            clock.look(at: 6_000_000_000, connection: connection)
            #expect(clock.charged == 4_000_000_000)
            loop.execute { box.connection.close() }
            FileDescriptor(adopting: peer).close()
        }
    }

    /// Output that never drains (the peer reads a little less than it is sent, as a worker kept busy with a queue
    /// of large begins does) does not keep what was written: the buffer stays within a few times what waits,
    /// however much goes through it, and a frame's descriptors still go with its first byte. Every byte ever sent
    /// was kept until the output drained: a daemon held 512 MiB of buffer for 125 MiB waiting.
    @Test func outputThatNeverDrainsDoesNotKeepWhatWasWritten() throws {
        try withSocketPair(capacity: 64 << 10) { kernel, loop, ours, peer in
            final class Box: @unchecked Sendable { let connection: FramedConnection; init(_ c: FramedConnection) { connection = c } }
            let box = Box(FramedConnection(FileDescriptor(adopting: ours), loop: loop, limits: .default))
            let connection = box.connection
            loop.execute { try? box.connection.start(onMessage: { _ in }, onEnd: { _ in }) }
            loop.runUntilIdle()
            let reader = PeerReader(kernel, loop, peer)
            @discardableResult func peerReads(_ bytes: Int) -> Int { reader.read(bytes) }
            let text = String(repeating: "x", count: 16_000)
            var mostWaiting = 0, largestBuffer = 0
            for round in 0..<200 {
                loop.execute { for _ in 0..<4 { try? box.connection.send(.error(message: text, id: nil)) } }
                loop.runUntilIdle()
                peerReads(60 << 10)
                mostWaiting = max(mostWaiting, connection.pendingOutputBytes)
                largestBuffer = max(largestBuffer, connection.outputBufferCapacity)
                // It falls behind by 4 KiB a round: once the kernel's 64 KiB are full (about round 20), output waits
                // here and never drains.
                if round >= 30 { #expect(connection.pendingOutputBytes > 0, "drained at round \(round)") }
            }
            #expect(connection.bytesWritten > 10 << 20)
            #expect(largestBuffer <= 4 * mostWaiting + (256 << 10), "a buffer of \(largestBuffer) bytes for at most \(mostWaiting) waiting")
            // A frame with a file, queued behind what waits, and more behind it (the buffer is compacted while it
            // waits): its descriptor arrives with its first byte.
            let file = try FileAttachment(bytes: [1, 2, 3])
            let fileFrameStart = connection.bytesQueued
            loop.execute { try? box.connection.send(.partial(id: RequestID(), items: [ExtensionItem(title: "f", fileAttachments: [file])])) }
            loop.runUntilIdle()
            var arrivedWith: Int?
            for round in 0..<1000 where arrivedWith == nil && reader.readBytes < connection.bytesQueued {
                if round < 40 {
                    loop.execute { for _ in 0..<4 { try? box.connection.send(.error(message: text, id: nil)) } }
                    loop.runUntilIdle()
                }
                let start = peerReads(60 << 10)
                if !reader.received.isEmpty { arrivedWith = start }
            }
            let at = try #require(arrivedWith, "the descriptor never arrived")
            #expect(at <= fileFrameStart && fileFrameStart < reader.readBytes,
                    "read from \(at) to \(reader.readBytes); the frame starts at \(fileFrameStart)")
            #expect(reader.received.count == 1)
            for fd in reader.received { FileDescriptor(adopting: fd).close() }  // a real memfd's copy
            loop.execute { box.connection.close() }
            FileDescriptor(adopting: peer).close()
        }
    }

    /// A connection held back for the output budget (`pauseForBudget`) reads nothing from its peer until its own
    /// unread output is under the mark it was given: it waits on its own reading, not on the other connections'.
    @Test func aConnectionHeldBackForTheBudgetIsReadAgainOnceItHasReadItsOwnOutput() throws {
        try withSocketPair(capacity: 4096) { kernel, loop, ours, peer in
            final class Box: @unchecked Sendable {
                let connection: FramedConnection
                var messages = 0
                init(_ c: FramedConnection) { connection = c }
            }
            let box = Box(FramedConnection(FileDescriptor(adopting: ours), loop: loop, limits: .default))
            let connection = box.connection
            connection.outputBudget = OutputBudget(limit: 1 << 30)
            loop.execute {
                try? box.connection.start(onMessage: { _ in box.messages += 1 }, onEnd: { _ in })
                for _ in 0..<10 { try? box.connection.send(.error(message: String(repeating: "x", count: 10_000), id: nil)) }
                box.connection.pauseForBudget(resumeBelow: 20_000)
            }
            loop.runUntilIdle()
            #expect(connection.pendingOutputBytes > 90_000 && connection.isPausedForBudget)
            let ping = try Frame.encode(Message.ping(seq: 7).plist)
            #expect(ping.withUnsafeBytes { kernel.send(peer, $0, descriptors: []) } == ping.count)
            loop.runUntilIdle()
            #expect(box.messages == 0, "read while held back")
            // The peer reads its output down to the mark: read again, the ping is taken.
            let reader = PeerReader(kernel, loop, peer)
            for _ in 0..<100 where connection.pendingOutputBytes > 20_000 { reader.read(4096) }
            #expect(!connection.isPausedForBudget)
            #expect(box.messages == 1)
            loop.execute { box.connection.close() }
            loop.runUntilIdle()
            #expect(connection.outputBudget?.used == 0, "a closed connection charges nothing")
            FileDescriptor(adopting: peer).close()
        }
    }

    /// A simulated kernel of `capacity` (current on this thread), a loop driven on this thread, and a socket pair,
    /// for `body`, which closes its connection and the peer; then the loop stopped, and every simulated descriptor
    /// found closed.
    func withSocketPair(capacity: Int, clock: ManualClock = ManualClock(),
                        _ body: (SimulatedKernel, EventLoop, _ ours: Int32, _ peer: Int32) throws -> Void) throws
    {
        let kernel = SimulatedKernel(capacity: capacity)
        SimulatedKernel.current = kernel
        defer { SimulatedKernel.current = nil }
        let loop = try EventLoop(name: "framed-connection", clock: clock, driven: true)
        let (ours, peer) = kernel.socketPair()
        try body(kernel, loop, ours, peer)
        loop.stop()
        loop.runUntilIdle()
        #expect(kernel.openCount == 0, "left open: \(kernel.openDescriptors)")
    }
}

/// The peer's end of a simulated socket pair, read as a worker would, with the loop run after each read.
final class PeerReader {
    let kernel: SimulatedKernel, loop: EventLoop, fd: Int32
    private var buffer = [UInt8](repeating: 0, count: 64 << 10)
    private var truncated = false
    /// Descriptors received so far, and the bytes read.
    private(set) var received: [Int32] = [], readBytes = 0

    init(_ kernel: SimulatedKernel, _ loop: EventLoop, _ fd: Int32) {
        self.kernel = kernel
        self.loop = loop
        self.fd = fd
    }

    /// Reads up to `bytes` (at most 64 KiB); returns where in the stream the read started.
    @discardableResult func read(_ bytes: Int) -> Int {
        let start = readBytes
        let n = buffer.withUnsafeMutableBytes {
            kernel.receive(fd, into: UnsafeMutableRawBufferPointer(rebasing: $0[..<bytes]), descriptors: &received,
                           maxDescriptors: 8, truncated: &truncated)
        }
        if n > 0 { readBytes += n }
        loop.runUntilIdle()
        return start
    }
}
