// HostileClient: a client that speaks the daemon's wire protocol badly on purpose, over a raw socket, so the
// tests can send what the client library never would: huge deadlines, amplifying frames, half frames, floods,
// and never read a reply.
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix

#if canImport(Glibc)
import Glibc
#endif

final class HostileClient {
    let fd: Int32
    private var reader = FrameReader(limits: WireLimits(maxFrameBytes: 64 << 20))

    /// Connects (blocking socket, so writes push until the daemon stops reading).
    init(_ socket: String) throws {
        fd = try connectUnix(path: socket).release()  // owned by this object from here on; closed in deinit
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, flags & ~O_NONBLOCK)
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close(fd) }

    /// Writes raw bytes; returns false once the daemon has hung up (or stopped reading for 10 s).
    @discardableResult
    func write(_ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return false }
            offset += n
        }
        return true
    }

    @discardableResult
    func send(_ message: Message) -> Bool { write(try! Frame.encode(message.plist, limits: WireLimits(maxFrameBytes: 64 << 20))) }

    /// Writes `bytes` with `descriptors` (at most 64) attached to the first byte, whatever the frame says.
    @discardableResult
    func write(_ bytes: [UInt8], descriptors: [Int32]) -> Bool {
        let sent = bytes.withUnsafeBytes { raw in Result { () throws(SystemError) in try sendAll(fd, raw, descriptors: descriptors) } }
        if case .success = sent { return true }
        return false
    }

    @discardableResult
    func handshake() -> Bool { send(.connect(version: protocolVersion)) }

    /// The next message from the daemon within `timeout` seconds, nil on timeout or EOF.
    func receive(timeout: Double = 10) -> Message? {
        let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
        while true {
            if let value = try? reader.nextValue(), let message = try? Message(plist: value) { return message }
            let left = Int64(deadline) - Int64(monotonicNanoseconds())
            guard left > 0 else { return nil }
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, Int32(min(left / 1_000_000 + 1, 1000))) >= 0 else { return nil }
            guard pfd.revents != 0 else { continue }
            var buffer = [UInt8](repeating: 0, count: 65536)
            let n = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if n == 0 { return nil }
            if n > 0 { buffer.withUnsafeBytes { reader.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) } }
        }
    }

    /// Waits for the terminal message of `id` (complete, cancelled, interrupted), skipping others.
    func outcome(of id: RequestID, timeout: Double = 30) -> Message? {
        let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
        while monotonicNanoseconds() < deadline {
            guard let message = receive(timeout: 1) else { continue }
            switch message {
            case .complete(let got, _) where got == id, .cancelled(let got, _) where got == id,
                .interrupted(let got, _) where got == id:
                return message
            default: continue
            }
        }
        return nil
    }

    /// The completions of `ids` that arrive within `timeout` seconds, in whatever order, by id (other messages are
    /// read and dropped).
    func completions(of ids: some Sequence<RequestID>, timeout: Double) -> [RequestID: [ExtensionItem]] {
        let wanted = Set(ids)
        var got: [RequestID: [ExtensionItem]] = [:]
        let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
        while got.count < wanted.count, monotonicNanoseconds() < deadline {
            if case .complete(let id, let items)? = receive(timeout: 1), wanted.contains(id) { got[id] = items }
        }
        return got
    }

    /// Whether the daemon has closed its end, asked without reading anything: a hang-up shows with bytes unread.
    var isHungUpUnread: Bool {
        var pfd = pollfd(fd: fd, events: 0, revents: 0)  // POLLHUP is reported whatever is asked
        return poll(&pfd, 1, 0) == 1 && pfd.revents & Int16(POLLHUP) != 0
    }

    /// Whether the daemon has closed this connection (EOF or reset), waiting up to `timeout` seconds.
    func isClosedByDaemon(timeout: Double = 15) -> Bool {
        let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
        var buffer = [UInt8](repeating: 0, count: 65536)
        while monotonicNanoseconds() < deadline {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            _ = poll(&pfd, 1, 100)
            if pfd.revents == 0 { continue }
            let n = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) { return true }
        }
        return false
    }
}

/// A begin for `extensionID` with one item titled `title`.
func begin(_ extensionID: String, _ title: String, deadlineMs: Int64? = nil, attachmentBytes: Int = 0) -> (RequestID, Message) {
    let id = RequestID()
    let item = ExtensionItem(title: title, attachments: attachmentBytes > 0 ? [.data([UInt8](repeating: 0x5A, count: attachmentBytes))] : [])
    return (id, .begin(id: id, items: [item], extensionID: extensionID, deadlineMs: deadlineMs))
}

/// A bplist whose one array refers to one data object `references` times: small on the wire, huge if every
/// reference were expanded.
func amplifyingPayload(dataBytes: Int, references: Int) -> [UInt8] {
    var out = Array("bplist00".utf8)
    let arrayOffset = out.count
    out += [0xAF, 0x12] + withUnsafeBytes(of: UInt32(references).bigEndian, Array.init)
    for _ in 0..<references { out += [0x00, 0x01] }  // 2-byte references to object 1
    let dataOffset = out.count
    out += [0x4F, 0x12] + withUnsafeBytes(of: UInt32(dataBytes).bigEndian, Array.init)
    out += [UInt8](repeating: 0x41, count: dataBytes)
    let tableOffset = out.count
    out += withUnsafeBytes(of: UInt32(arrayOffset).bigEndian, Array.init)
    out += withUnsafeBytes(of: UInt32(dataOffset).bigEndian, Array.init)
    out += [0, 0, 0, 0, 0, 0, 4, 2]
    out += withUnsafeBytes(of: UInt64(2).bigEndian, Array.init)
    out += withUnsafeBytes(of: UInt64(0).bigEndian, Array.init)
    out += withUnsafeBytes(of: UInt64(tableOffset).bigEndian, Array.init)
    return out
}

/// A frame carrying `payload`.
func frame(_ payload: [UInt8]) -> [UInt8] {
    withUnsafeBytes(of: UInt32(payload.count).bigEndian, Array.init) + payload
}
