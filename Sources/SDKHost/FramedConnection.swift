// FramedConnection: a non-blocking stream socket that carries frames, owned by one event loop. The worker
// channel, the daemon's client sessions and the client library's daemon connection all use it: it reads until
// EAGAIN, decodes frames into messages, buffers output and asks for EPOLLOUT only while the socket pushes back,
// and reports its end exactly once.

import SDKPosix

/// Why a connection ended.
package enum ConnectionEnd: Equatable, Sendable {
    /// The peer closed it.
    case endOfFile
    /// A read or write failed.
    case broken(String)
    /// The peer sent something that is not a valid frame or message.
    case badInput(String)
}

/// Loop-confined: every method must run on `loop`'s thread.
package final class FramedConnection {
    package let fd: Int32
    let loop: EventLoop
    private var descriptor: FileDescriptor?
    private var reader: FrameReader
    private var encoder = BinaryPlistEncoder()
    private var outbound: [UInt8] = []
    private var sent = 0
    private var wantsWritable = false
    private var flushScheduled = false
    private var readBuffer = [UInt8](repeating: 0, count: 16 * 1024)
    private var onMessage: ((Message) -> Void)?
    private var onEnd: ((ConnectionEnd) -> Void)?
    private var registered = false

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
        guard isOpen else { return }
        if sent == outbound.count {
            outbound.removeAll(keepingCapacity: true)
            sent = 0
        }
        try Frame.encode(message.plist, with: &encoder, appendingTo: &outbound, limits: reader.limits)
        if !wantsWritable && !flushScheduled {
            flushScheduled = true
            loop.runBeforeSleeping { [self] in
                flushScheduled = false
                flush()
            }
        }
    }

    /// Reads and delivers everything available now (also used to collect a dying peer's last words).
    package func drain() {
        while isOpen {
            let result = readBuffer.withUnsafeMutableBytes { raw in
                Result { () throws(SystemError) in try readNonBlocking(fd, into: raw) }
            }
            switch result {
            case .success(.bytes(let n)):
                readBuffer.withUnsafeBytes { reader.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
                deliverFrames()
            case .success(.wouldBlock):
                return
            case .success(.endOfFile):
                // Bytes of an unfinished frame at EOF: the peer sent a truncated frame.
                let left = reader.bufferedByteCount
                end(left > 0 ? .badInput("truncated frame: connection closed with \(left) byte(s) of a frame unread") : .endOfFile)
            case .failure(let error):
                end(.broken(error.description))
            }
        }
    }

    /// Closes without calling `onEnd`, after a best-effort, non-blocking write of anything still queued (a
    /// refusal or a last reply sent just before closing must not be lost to the write coalescing).
    package func close() {
        while isOpen, sent < outbound.count {
            let result = outbound.withUnsafeBytes { raw in
                Result { () throws(SystemError) in try sendNonBlocking(fd, UnsafeRawBufferPointer(rebasing: raw[sent...])) }
            }
            guard case .success(.bytes(let n)) = result else { break }
            sent += n
        }
        if registered {
            loop.unregister(fd)
            registered = false
        }
        descriptor.take()?.close()
        onMessage = nil
        onEnd = nil
    }

    private func handle(_ events: UInt32) {
        if events & EventLoop.writable != 0 { flush() }
        if events & ~EventLoop.writable != 0 { drain() }
    }

    private func deliverFrames() {
        while isOpen {
            let message: Message
            do {
                guard let value = try reader.nextValue() else { return }
                message = try Message(plist: value)
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
        while sent < outbound.count, isOpen {
            let result = outbound.withUnsafeBytes { raw in
                Result { () throws(SystemError) in try sendNonBlocking(fd, UnsafeRawBufferPointer(rebasing: raw[sent...])) }
            }
            switch result {
            case .success(.bytes(let n)): sent += n
            case .success(.wouldBlock):
                if !wantsWritable {
                    wantsWritable = true
                    try? loop.modify(fd, events: EventLoop.readable | EventLoop.writable)
                }
                return
            case .success(.endOfFile), .failure:
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
        if wantsWritable, isOpen {
            wantsWritable = false
            try? loop.modify(fd, events: EventLoop.readable)
        }
    }

    private func end(_ reason: ConnectionEnd) {
        let callback = onEnd
        close()
        callback?(reason)
    }
}
