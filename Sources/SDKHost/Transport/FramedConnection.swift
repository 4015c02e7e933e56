// FramedConnection: a non-blocking stream socket that carries frames, owned by one event loop. The worker
// channel, the daemon's client sessions and the client library's daemon connection all use it: it decodes
// frames into messages, buffers output and asks for EPOLLOUT only while the socket pushes back, and reports its
// end exactly once.
//
// Against a hostile peer: it reads at most `readsPerTurn` chunks per readable event (epoll is level-triggered,
// so the rest waits for the next turn and other peers get theirs); with an output limit, a peer that does not
// read its replies stops being read once its unread output passes the limit (NIO's write watermarks) and is
// disconnected once it passes the limit plus one frame; it records since when a frame has been half-received
// and since when output has been stuck, so its owner can time either out; and it charges its input buffer to a
// budget shared by all connections, so many half-sent frames cannot add up without bound.
//
// Descriptors (SCM_RIGHTS) ride along: each one received is wrapped at once in a FileAttachment, so it is closed
// whatever becomes of it; a complete frame takes as many from the front of the queue as its `fds` says (Messages
// .swift). A message's own descriptors are sent with the sendmsg that writes its frame's first byte.

import SDKWire
import SDKPosix
import CSDKShim

#if canImport(Glibc)
import Glibc
#endif

/// Why a connection ended.
package enum ConnectionEnd: Equatable, Sendable {
    /// The peer closed it.
    case endOfFile
    /// A read or write failed.
    case broken(String)
    /// The peer sent something that is not a valid frame or message.
    case badInput(String)
    /// The peer's stream ended (an end of file, or a reset after its last bytes) in the middle of a frame. Bad
    /// input from a peer that meant to stop; from a process dying by a signal, what its death cut short (the
    /// engine decides once it knows how the worker ended).
    case truncated(String)
    /// The peer does not read what it is sent: past the output limit, or the unread-descriptor limit.
    case notReading(String)
}

/// Bytes of input buffered across many connections, with a ceiling. Loop-confined.
package final class InputBudget {
    package let limit: Int
    package private(set) var used = 0
    package init(limit: Int) { self.limit = limit }
    fileprivate func add(_ delta: Int) { used += delta }
}

/// Bytes of output queued and unread across many connections (the daemon's clients), with a ceiling. Past it,
/// `onOver` runs once the loop is about to sleep, for the owner to hold the connections back (`pauseForBudget`) and
/// end those that do not read (`FramedConnection.outputWaitingSince`); back under three quarters of it, `onUnder`
/// runs. Each connection's own `outputLimit` bounds one peer; this bounds them all: twenty clients that never read
/// held ~24 MiB each and took a daemon past 1 GB. Loop-confined.
package final class OutputBudget {
    package let limit: Int
    package private(set) var used = 0
    package var onOver: (() -> Void)?
    package var onUnder: (() -> Void)?
    private var overScheduled = false
    /// `onOver` ran, and `onUnder` has not since.
    private var over = false
    package init(limit: Int) { self.limit = limit }
    /// Back under three quarters of the limit, where connections held back are read again.
    package var isUnderResumeMark: Bool { used <= limit - limit / 4 }
    fileprivate func add(_ delta: Int, on loop: EventLoop) {
        used += delta
        if delta > 0, used > limit, !overScheduled {
            overScheduled = true
            loop.runBeforeSleeping { [self] in
                overScheduled = false
                guard used > limit else { return }
                over = true
                onOver?()
            }
        } else if delta < 0, over, isUnderResumeMark {
            over = false
            loop.runBeforeSleeping { [self] in onUnder?() }
        }
    }
}

/// Loop-confined: every method must run on `loop`'s thread.
package final class FramedConnection {
    // The stored state is `@exclusivity(unchecked)` but for `currentPayload`: no access to it spans a call into
    // code that could touch this connection again. Every callback (`onMessage`, `onForwardable`, `onEnd`) is read
    // into a local and called after the access ends, and is only ever assigned whole (a deinit its release runs
    // meets the new value); the closures that run inside an access (`withNextPayload`'s,
    // `withUnsafeBytes` around a send or receive) call the codec and the syscall wrappers only. `currentPayload`
    // keeps its checks: `withForwardablePayload` holds it while the owner's closure runs. The checks were ~2,800
    // runtime calls in a simulated schedule, ~3% of its instructions.
    package let fd: Int32
    let loop: EventLoop
    @exclusivity(unchecked) private var descriptor: FileDescriptor?
    @exclusivity(unchecked) private var reader: FrameReader
    @exclusivity(unchecked) private var encoder = BinaryPlistEncoder()
    @exclusivity(unchecked) private var outbound: [UInt8] = []
    @exclusivity(unchecked) private var sent = 0
    /// Bytes written over the connection's life, and where (in those bytes) each frame that carried descriptors
    /// started, with how many, until the peer has read past it (`unreadDescriptors`).
    @exclusivity(unchecked) private var written = 0
    @exclusivity(unchecked) private var descriptorsWritten = Deque<(start: Int, count: Int)>()
    @exclusivity(unchecked) private var descriptorsWrittenCount = 0
    /// Where (in the bytes queued over the connection's life) each frame marked by `markLastFrame` ends, until it
    /// has been written to the kernel.
    @exclusivity(unchecked) private var markedEnds = Deque<Int>()
    @exclusivity(unchecked) private var wantsWritable = false
    @exclusivity(unchecked) private var flushScheduled = false
    @exclusivity(unchecked) private var readBuffer = [UInt8](uninitializedCount: 16 * 1024)
    @exclusivity(unchecked) private var onMessage: ((Message) -> Void)?
    @exclusivity(unchecked) private var onEnd: ((ConnectionEnd) -> Void)?
    @exclusivity(unchecked) private var registered = false
    @exclusivity(unchecked) private var readingPaused = false
    /// Since when the peer is not read because the output of many connections is over their budget
    /// (`pauseForBudget`), or nil.
    @exclusivity(unchecked) private var budgetPausedSince: UInt64?
    /// Read again once no more than this waits unread (`pauseForBudget`).
    @exclusivity(unchecked) private var budgetResumeBelow = 0
    /// Not read for now: for this connection's own output, or for the budget's.
    private var notReading: Bool { readingPaused || budgetPausedSince != nil }
    /// Descriptors received and not yet claimed by a complete frame.
    @exclusivity(unchecked) private var incoming = IncomingDescriptors()
    @exclusivity(unchecked) private var receivedRaw: [Int32] = []
    /// Where in `outbound` the frames that carry descriptors start.
    @exclusivity(unchecked) private var outgoing = OutgoingDescriptors()

    /// Written bytes a buffer keeps before what waits may be moved down (`readyToQueue`).
    package static let compactionThreshold = 64 << 10
    /// Chunks read per readable event before the loop moves on.
    package static let readsPerTurn = 8
    /// Unread output above which the peer is no longer read; nil for no limit. Past it plus one frame, the
    /// connection ends.
    @exclusivity(unchecked) package var outputLimit: Int?
    /// Shared ceiling for buffered input; nil for none.
    @exclusivity(unchecked) package var inputBudget: InputBudget?
    @exclusivity(unchecked) private var charged = 0
    /// Shared ceiling for unread output; nil for none.
    @exclusivity(unchecked) package var outputBudget: OutputBudget?
    @exclusivity(unchecked) private var outputCharged = 0
    /// With an `outputBudget`: since when output has waited here with the peer taking none of it (nil while none
    /// waits), so that the budget's owner can tell a peer that does not read from one that reads a large reply.
    @exclusivity(unchecked) package private(set) var outputWaitingSince: UInt64?
    /// When the current half-received frame started arriving, or nil when no frame is half-received.
    @exclusivity(unchecked) package private(set) var partialFrameSince: UInt64?
    /// When unread output first passed `outputLimit`, or nil while it is under.
    @exclusivity(unchecked) package private(set) var outputStalledSince: UInt64?
    /// Bytes the message being delivered to `onMessage` holds: its payload or, if larger, its decoded size (for
    /// accounting by the owner).
    @exclusivity(unchecked) package private(set) var currentFrameBytes = 0
    /// Keep each payload, while its message is delivered, for `withForwardablePayload` (the daemon forwards
    /// payloads instead of encoding them again). Off by default: it costs a copy per frame.
    @exclusivity(unchecked) package var keepsPayloads = false
    private var currentPayload: [UInt8] = []
    /// The most `currentPayload` keeps between frames (its capacity).
    static let retainedPayloadCapacity = 64 << 10
    /// Offered each `begin` and `complete` that `ForwardScan` can vouch for (with `keepsPayloads`), before it is
    /// decoded; the payload is `withForwardablePayload`'s while it runs. True means taken: the frame is not
    /// decoded or delivered to `onMessage`. False, and it is decoded and delivered as any other.
    @exclusivity(unchecked) package var onForwardable: ((ScannedMessage) -> Bool)?
    /// What to tell the peer, if anything, before the connection closes on input that breaks the protocol (a
    /// malformed or truncated frame): the daemon says why it drops a client. Written as far as the socket takes
    /// it at once, as anything queued at a close is.
    @exclusivity(unchecked) package var farewell: ((ConnectionEnd) -> Message?)?
    /// Output queued and not yet written.
    package var pendingOutputBytes: Int { outbound.count - sent }
    /// Bytes the output buffer holds room for: what waits, what was written before it, and spare capacity.
    package var outputBufferCapacity: Int { outbound.capacity }
    /// Bytes the kernel has taken over the connection's life.
    package var bytesWritten: Int { written }
    /// Bytes queued over the connection's life, written or not: where the frame queued last ends (it has left this
    /// process once `bytesWritten` reaches it).
    package var bytesQueued: Int { written + pendingOutputBytes }
    /// Whether the peer is not read for now: its own unread output over `outputLimit`, or held back for the budget.
    package var isReadingPaused: Bool { notReading }
    /// Bytes of memory the payload kept for `withForwardablePayload` holds (its capacity).
    package var keptPayloadCapacity: Int { currentPayload.capacity }
    /// Descriptors sent or queued that the peer has not read, above which the connection ends; nil for no limit.
    /// A peer that never reads would otherwise keep them open in this process and in the kernel (which limits
    /// descriptors in flight per user: others' descriptor passing would fail).
    @exclusivity(unchecked) package var unreadDescriptorLimit: Int?

    /// Descriptors queued here or written and not yet read by the peer (SIOCOUTQ says how far it has read).
    package var unreadDescriptors: Int {
        if descriptorsWrittenCount > 0 {
            let unreadBytes = unreadOutputBytes(fd)
            let readUpTo = written - max(unreadBytes, 0)
            while let first = descriptorsWritten.first, first.start < readUpTo {
                _ = descriptorsWritten.popFirst()
                descriptorsWrittenCount -= first.count
            }
        }
        return descriptorsWrittenCount + outgoing.queuedCount
    }

    /// Marks the frame just queued, to be counted by `markedFramesQueued` while it waits here to be written.
    package func markLastFrame() {
        if isOpen { markedEnds.append(written + pendingOutputBytes) }
    }

    /// Frames marked by `markLastFrame` still queued here, not yet taken by the kernel: held by this process
    /// because the peer has not read what came before them (the kernel's buffer to it is full). What the peer
    /// has read cannot be told more finely: on a unix socket SIOCOUTQ counts the kernel's memory for the unread
    /// buffers (768 bytes for a small write here), not their bytes.
    package var markedFramesQueued: Int {
        while let first = markedEnds.first, first <= written { _ = markedEnds.popFirst() }
        return markedEnds.count
    }

    package init(_ descriptor: consuming FileDescriptor, loop: EventLoop, limits: WireLimits) {
        fd = descriptor.rawValue
        self.descriptor = consume descriptor
        self.loop = loop
        reader = FrameReader(limits: limits)
    }

    /// True until the connection is closed.
    package var isOpen: Bool { descriptor != nil }

    /// Starts watching the socket. `onMessage` receives each message in order; `onEnd` is called once, after
    /// which the connection is closed and calls neither again.
    package func start(onMessage: @escaping (Message) -> Void, onEnd: @escaping (ConnectionEnd) -> Void)
        throws(SystemError)
    {
        self.onMessage = onMessage
        self.onEnd = onEnd
        try loop.register(fd, events: EventLoop.readable) { [unowned self] events in self.handle(events) }
        registered = true
    }

    /// Queues `message`; it is written, with everything else queued in this loop iteration, before the loop next
    /// waits. An over-limit message throws and is not queued.
    package func send(_ message: Message) throws(WireError) {
        guard readyToQueue() else { return }
        try outgoing.encode(message, with: &encoder, appendingTo: &outbound, limits: reader.limits)
        queued()
    }

    /// Queues `bytes` as they are, with no frame around them and no limit applied (`sdk-host conformance`'s
    /// malformed and oversized frames).
    package func sendUnchecked(_ bytes: [UInt8]) {
        guard readyToQueue() else { return }
        outbound.append(contentsOf: bytes)
        queued()
    }

    /// False once closed; otherwise empties a fully written output buffer before more is appended.
    private func readyToQueue() -> Bool {
        guard isOpen else { return false }
        if sent == outbound.count {
            outbound.removeAll(keepingCapacity: outbound.capacity <= 256 << 10)
            sent = 0
        } else if sent >= Self.compactionThreshold, sent >= outbound.count - sent {
            // What was written stayed in the buffer until all of it was: a peer that never let it drain (a worker
            // kept busy with a queue of 1 MiB begins) had every byte ever sent to it kept, 512 MiB of buffer for
            // 125 MiB waiting. Once as much is written as waits, what waits moves to a buffer of its own size:
            // a byte is moved at most once for every byte written before it.
            outbound = Array(outbound[sent...])
            outgoing.dropWritten(sent)
            sent = 0
        }
        return true
    }

    /// Bytes were queued: applies the output limit and schedules the flush.
    private func queued() {
        if outputBudget != nil {
            if outputWaitingSince == nil { outputWaitingSince = loop.now }
            chargeOutput()
        }
        if let limit = outputLimit, pendingOutputBytes > limit { outputOverLimit(limit) }
        if !wantsWritable && !flushScheduled {
            flushScheduled = true
            loop.runBeforeSleeping { [self] in
                flushScheduled = false
                flush()
            }
        }
    }

    /// The payload of the message being delivered to `onMessage` (with `keepsPayloads`; empty otherwise), if it
    /// can be forwarded as it is: it carries no descriptors (a forwarded frame would have to carry exactly the
    /// ones it claimed, in its order; those messages are encoded again instead).
    package func withForwardablePayload<R>(_ body: (UnsafeRawBufferPointer?) -> R) -> R {
        guard keepsPayloads, incoming.lastClaimed == 0, !currentPayload.isEmpty else { return body(nil) }
        return currentPayload.withUnsafeBytes { body($0) }
    }

    /// Queues a forwarded payload (`ForwardedFrame`) with `id` written over its own, as `send` queues a message.
    package func sendForwarded(_ payload: UnsafeRawBufferPointer, id: RequestID, idRange: Range<Int>) throws(WireError) {
        guard readyToQueue() else { return }
        try outgoing.appendForwarded(payload, id: id, idRange: idRange, to: &outbound, limits: reader.limits)
        queued()
    }

    /// Reads and delivers what is available now, at most `maxReads` chunks (everything, by default: used to
    /// collect a dying peer's last words). A budgeted drain also stops at a read that did not fill the buffer:
    /// the socket was empty a moment ago, and epoll, level-triggered, reports whatever arrives since. That saves
    /// the read that would only say EAGAIN: nearly half of all reads under load, before.
    /// The peer is gone or going (its process is exiting): reads what is left. Half a frame left is a truncated
    /// frame whether or not the end of file was read yet (a dying process's exit can be seen before its socket
    /// closes, and it writes nothing more).
    package func drainLast() {
        drain()
        let left = reader.bufferedByteCount
        if isOpen, left > 0 { end(.truncated(Self.truncatedFrame(left))) }
    }

    static func truncatedFrame(_ left: Int) -> String {
        "truncated frame: connection closed with \(left) byte(s) of a frame unread"
    }

    package func drain(maxReads: Int = .max) {
        var reads = 0
        while isOpen, reads < maxReads, !notReading || maxReads == .max {
            reads += 1
            var truncated = false
            let result = readBuffer.withUnsafeMutableBytes { raw in
                Result { () throws(SystemError) in
                    try receiveNonBlocking(fd, into: raw, descriptors: &receivedRaw, truncated: &truncated)
                }
            }
            if !receivedRaw.isEmpty || truncated, let problem = incoming.adopt(&receivedRaw, truncated: truncated) {
                end(.badInput(problem))
                return
            }
            switch result {
            case .success(.bytes(let n)):
                readBuffer.withUnsafeBytes { reader.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
                let buffered = reader.bufferedByteCount
                if partialFrameSince == nil { partialFrameSince = loop.now }
                deliverFrames()
                guard isOpen else { return }
                if let problem = incoming.unclaimedProblem(frameHalfRead: reader.bufferedByteCount > 0) {
                    end(.badInput(problem))
                    return
                }
                // The clock times the frame now unfinished: none is, or one began in this read (a frame ended in
                // it), or the one that was unfinished goes on. A peer whose reads never end on a frame boundary
                // but whose frames all finish is never timed out.
                if reader.bufferedByteCount == 0 {
                    partialFrameSince = nil
                } else if reader.bufferedByteCount < buffered {
                    partialFrameSince = loop.now
                }
                guard chargeInput() else { return }
                if n < readBuffer.count, maxReads != .max { return }
            case .success(.wouldBlock):
                return
            case .success(.endOfFile):
                // Bytes of an unfinished frame at EOF: the peer sent a truncated frame.
                let left = reader.bufferedByteCount
                end(left > 0 ? .truncated(Self.truncatedFrame(left)) : .endOfFile)
            case .failure(let error):
                // A peer that closed with something of ours unread resets the socket (ECONNRESET) once what it
                // wrote is read: half a frame left is a truncated frame all the same. (It was reported as a broken
                // socket, and the worker's requests ended with its exit status: a Crasher `truncate` that exited 0
                // with a ping unread showed "exit 0", under load.)
                // At a frame boundary the reset says only that the peer has gone, as an end of file does: a client
                // stopped with Ctrl-C was logged as "dropped: recvmsg: Connection reset by peer", a warning.
                let left = reader.bufferedByteCount
                end(left > 0 ? .truncated(Self.truncatedFrame(left)) : error.errno == ECONNRESET ? .endOfFile : .broken(error.description))
            }
        }
    }

    /// One non-blocking write of queued output (`OutgoingDescriptors.nextWrite` says how far, with what).
    private func writeSome() -> Result<IOResult, SystemError> {
        let (end, descriptors) = outgoing.nextWrite(from: sent, upTo: outbound.count)
        let result = outbound.withUnsafeBytes { raw in
            Result { () throws(SystemError) in
                try sendNonBlocking(fd, UnsafeRawBufferPointer(rebasing: raw[sent..<end]), descriptors: descriptors)
            }
        }
        if case .success(.bytes(let n)) = result, n > 0 {
            outgoing.wrote(from: sent)
            // Kept only where a limit asks (the daemon's clients): the list shrinks only when it is read.
            if !descriptors.isEmpty, unreadDescriptorLimit != nil {
                descriptorsWritten.append((written, descriptors.count))
                descriptorsWrittenCount += descriptors.count
            }
            written += n
        }
        return result
    }

    /// Closes without calling `onEnd`, after a best-effort, non-blocking write of anything still queued (a
    /// refusal or a last reply sent just before closing must not be lost to the write coalescing).
    package func close() {
        while isOpen, sent < outbound.count {
            guard case .success(.bytes(let n)) = writeSome() else { break }
            sent += n
        }
        if registered {
            loop.unregister(fd)
            registered = false
        }
        descriptor.take()?.close()
        chargeOutput()
        outputWaitingSince = nil
        // Nothing waits to be written any more: a closed connection counts no marked frame.
        markedEnds = Deque()
        onMessage = nil
        onForwardable = nil
        onEnd = nil
        farewell = nil
        inputBudget?.add(-charged)
        charged = 0
        reader = FrameReader(limits: reader.limits)
        outbound = []
        outgoing.removeAll()
        incoming.removeAll()
        sent = 0
    }

    /// Stops reading the peer while the output of many connections is over their budget (it can ask for nothing
    /// more), until no more than `resumeBelow` of its own output waits (or `resumeFromBudget`); its unfinished
    /// frame's clock stops with it.
    package func pauseForBudget(resumeBelow: Int) {
        guard isOpen, budgetPausedSince == nil else { return }
        budgetPausedSince = loop.now
        budgetResumeBelow = resumeBelow
        updateInterest()
    }

    /// Reads the peer again after `pauseForBudget`.
    package func resumeFromBudget() {
        guard let paused = budgetPausedSince else { return }
        budgetPausedSince = nil
        excusePause(since: paused)
        if isOpen { updateInterest() }
    }

    /// Moves an unfinished frame's clock on by the time since `paused` that this side did not read it: the frame
    /// does not age while it could not be finished. Moved on, not restarted: a peer that stalls this side now and
    /// then still has to finish its frame in the time allowed, counting only the time it was read.
    private func excusePause(since paused: UInt64) {
        if let since = partialFrameSince {
            partialFrameSince = since &+ (loop.now &- max(paused, since))
        }
    }

    /// Whether `pauseForBudget` holds it.
    package var isPausedForBudget: Bool { budgetPausedSince != nil }

    /// Charges what waits unread in the output to the shared budget.
    private func chargeOutput() {
        guard let budget = outputBudget else { return }
        let now = isOpen ? pendingOutputBytes : 0
        if now != outputCharged {
            budget.add(now - outputCharged, on: loop)
            outputCharged = now
        }
    }

    /// Charges the input buffer's growth to the shared budget; ends the connection when the budget is spent by
    /// a connection holding more than a small share of it. Returns false if it ended the connection.
    private func chargeInput() -> Bool {
        guard let budget = inputBudget else { return true }
        let now = reader.bufferCapacity
        budget.add(now - charged)
        charged = now
        if budget.used > budget.limit, now > 1 << 20 {
            end(.broken("input budget of \(budget.limit) bytes across connections is spent; this peer holds \(now)"))
            return false
        }
        return true
    }

    private func outputOverLimit(_ limit: Int) {
        if outputStalledSince == nil { outputStalledSince = loop.now }
        if pendingOutputBytes > limit + reader.limits.maxFrameBytes {
            // Deferred: `send` may be running inside the owner's own handler. Held to the end of the turn (not
            // weakly: a weak reference slows every retain of this connection for life); a connection closed by
            // then has no `onEnd` left, and ends no second time.
            let unread = pendingOutputBytes
            loop.runBeforeSleeping { [self] in
                self.end(.notReading("the peer does not read: \(unread) bytes of output unread"))
            }
            return
        }
        if !readingPaused {
            readingPaused = true
            updateInterest()
        }
    }

    private func updateInterest() {
        guard registered else { return }
        var events: UInt32 = notReading ? 0 : EventLoop.readable
        if wantsWritable { events |= EventLoop.writable }
        try? loop.modify(fd, events: events)
    }

    private func handle(_ events: UInt32) {
        if events & EventLoop.writable != 0 { flush() }
        guard isOpen, events & ~EventLoop.writable != 0 else { return }
        if notReading {
            // Paused for backpressure, yet epoll reports a hang-up or error whatever we asked for: read to the end
            // (what is left sits in the kernel's socket buffer, so this is bounded) rather than spin on it.
            if events & (EventLoop.hangUp | EventLoop.readable) != 0 { drain() }
        } else {
            drain(maxReads: Self.readsPerTurn)
        }
    }

    private func deliverFrames() {
        // The payload kept for `withForwardablePayload` is needed only while its message is delivered: past 64 KiB
        // it is let go once the frames read are delivered (an idle connection held its last frame, up to the
        // frame limit, uncharged: 16 MiB for each of a client's connections).
        defer { if currentPayload.capacity > Self.retainedPayloadCapacity { currentPayload = [] } }
        while isOpen {
            let message: Message
            do {
                var size = 0
                // What decoding the frame was charged, and (for a tree) its budget, for the items the tree becomes.
                var charged = 0, budget = 0
                let limits = reader.limits
                let keep = keepsPayloads
                let scans = keep && onForwardable != nil
                var scanned: ScannedMessage?
                // A message read without a `PlistValue` tree; `claimed` when it took its descriptors itself.
                var direct: Message?
                var claimed = false
                guard let decoded = try reader.withNextPayload({ payload throws(WireError) -> PlistValue? in
                    if keep {
                        currentPayload.removeAll(keepingCapacity: currentPayload.capacity <= Self.retainedPayloadCapacity)
                        currentPayload.append(contentsOf: payload)
                    }
                    var decoded = 0
                    defer { (size, charged) = (max(payload.count, decoded), decoded) }
                    // A flat message (`ping`, `pong`, `welcome`, `assigned`, `cancel`, ...) exactly as we write it: no decoding.
                    if let message = FlatFrame.message(from: payload) {
                        direct = message
                        return nil
                    }
                    if scans {
                        if let fields = ForwardScan.scan(payload, limits: limits) {
                            // A `partial` is not forwarded unread: built by the same walk instead of decoded.
                            if fields.kind == .partial, let message = ForwardScan.decode(payload, limits: limits, decodedBytes: &decoded) {
                                direct = message
                                return nil
                            }
                            scanned = fields
                            decoded = fields.decodedBytes
                            return nil
                        }
                        // What the scan refuses, the same walk building items refuses too, but for a message
                        // with descriptors: that is never forwarded unread, and is read as below.
                    }
                    if let message = incoming.decodeDirectly(payload, limits: limits, decodedBytes: &decoded) {
                        // A `begin`, `complete` or `partial`: its items built without the dictionaries, its
                        // descriptors claimed.
                        direct = message
                        claimed = true
                        return nil
                    }
                    budget = limits.decodedBytesBudget(payloadBytes: payload.count)
                    return try BinaryPlistDecoder.decode(payload, limits: limits, decodedBytes: &decoded)
                }) else { return }
                currentFrameBytes = size
                if let direct {
                    if !claimed { incoming.claimedNone() }
                    onMessage?(direct)
                    continue
                }
                // A scanned frame carries no descriptors (it has no `fds`): it claims none, as a decoded one would.
                if let scanned, let onForwardable {
                    incoming.claimedNone()
                    if onForwardable(scanned) { continue }
                }
                guard let value = decoded else {
                    // A scanned frame not forwarded after all (a completion come late, say): read by the scan's own
                    // walk, which takes what the scan took at the same charge. A tree costs more (its dictionaries)
                    // and could be refused where the scan was not: the worker ended for a late completion.
                    var walked = 0
                    guard let direct = currentPayload.withUnsafeBytes({ incoming.decodeDirectly($0, limits: limits, decodedBytes: &walked) })
                    else {
                        end(.badInput("bad frame: a frame the scan took was not read the same way"))
                        return
                    }
                    onMessage?(direct)
                    continue
                }
                message = try incoming.message(from: value, decodedBytes: &charged, budget: budget)
                currentFrameBytes = max(currentFrameBytes, charged)
            } catch let error as WireError {
                end(.badInput("bad frame: \(error)"))
                return
            } catch {
                end(.badInput("bad message: \(error)"))
                return
            }
            onMessage?(message)
        }
    }

    private func flush() {
        let writtenBefore = written
        defer {
            if outputBudget != nil, isOpen {
                if pendingOutputBytes == 0 {
                    outputWaitingSince = nil
                } else if written > writtenBefore {
                    outputWaitingSince = loop.now
                }
                chargeOutput()
                if budgetPausedSince != nil, pendingOutputBytes <= budgetResumeBelow { resumeFromBudget() }
            }
        }
        if let limit = unreadDescriptorLimit, descriptorsWrittenCount + outgoing.queuedCount > limit {
            let unread = unreadDescriptors
            if unread > limit {
                // Deferred like the output limit: a flush may run inside the owner's own handler.
                loop.runBeforeSleeping { [self] in
                    self.end(.notReading("the peer leaves \(unread) descriptors unread (at most \(limit))"))
                }
                return
            }
        }
        while sent < outbound.count, isOpen {
            let result = writeSome()
            switch result {
            case .success(.bytes(let n)): sent += n
            case .success(.wouldBlock):
                watchWritable()
                return
            case .success(.endOfFile), .failure:
                // Written from an app's thread (`executeInline`): the end is the loop thread's to handle, not the
                // caller's. Watching for writability makes epoll report the error to the loop at once.
                if loop.runningInline {
                    watchWritable()
                    return
                }
                // A peer that hung up may have said why first (the daemon refusing a uid does): read that
                // before reporting the end.
                let failure = result
                drain()
                if isOpen {
                    if case .failure(let error) = failure { end(.broken(error.description)) } else { end(.endOfFile) }
                }
                return
            }
        }
        if sent == outbound.count, outbound.capacity > 256 << 10 {
            outbound = []
            sent = 0
        }
        if let limit = outputLimit, let stalled = outputStalledSince, pendingOutputBytes <= limit / 2 {
            outputStalledSince = nil
            readingPaused = false
            // (Its frame's clock ran on through the pause, and a daemon closed a client for a frame left unfinished
            // at its next sweep.)
            excusePause(since: stalled)
            if isOpen { updateInterest() }
        }
        if wantsWritable, isOpen, sent == outbound.count {
            wantsWritable = false
            updateInterest()
        }
    }

    /// Has epoll report the socket writable (or failed) to the loop, which flushes the rest.
    private func watchWritable() {
        guard !wantsWritable else { return }
        wantsWritable = true
        updateInterest()
    }

    private func end(_ reason: ConnectionEnd) {
        let callback = onEnd
        if let message = farewell?(reason) { try? send(message) }
        close()
        callback?(reason)
    }
}
