// WorkerRuntime: the worker's main loop. The main thread owns the socket (fd 3, set up by the host's spawn):
// it reads frames, answers pings itself (so a busy handler never looks hung), dispatches `begin` to the
// handler and `cancel` to the request's context. Handlers finish requests from any thread; frames go out
// under one lock. The process exits on EOF (host gone), on parent death, on a protocol error from the host,
// or after a long idle period (a backstop: the host normally retires idle workers itself by closing the socket).

#if canImport(Glibc)
import Glibc
#endif
import Dispatch
import CSDKShim
import SDKPosix
import Synchronization

enum WorkerLog {
    static let pid = getpid()
    static func write(_ message: String) {
        var line = "sdk-extension[\(pid)]: \(message)\n"
        line.withUTF8 { _ = Glibc.write(2, $0.baseAddress, $0.count) }
    }
}

/// The connection to the host, shared by the main loop and the handler threads.
final class HostConnection: Sendable {
    let fd: Int32
    /// Frames waiting to be written, and whether some thread is writing. Completions from many handler threads
    /// are coalesced: a thread that finds another one writing appends its frame and returns.
    private struct Outbox {
        var encoder = BinaryPlistEncoder()
        var pending: [UInt8] = []
        var spare: [UInt8] = []
        var writing = false
    }
    private let outbox = Mutex(Outbox())
    private let contexts = Mutex<[RequestID: ExtensionContext]>([:])

    init(fd: Int32) { self.fd = fd }

    /// Sends one message; a host that has gone away ends the process.
    func send(_ message: Message) {
        let (queued, failure) = outbox.withLock { (o: inout Outbox) -> (Bool, String?) in
            do throws(WireError) {
                try Frame.encode(message.plist, with: &o.encoder, appendingTo: &o.pending)
            } catch {
                // A reply too large for a frame still ends its request: as cancelled, with an error saying why.
                guard case .complete(let id, _) = message else { return (false, "cannot encode \(message): \(error)") }
                let refusal = Message.cancelled(id: id, error: ExtensionError(
                    domain: "SDKExtension", code: 3, message: "reply too large: \(error.detail)"))
                try? Frame.encode(refusal.plist, with: &o.encoder, appendingTo: &o.pending)
                if o.writing { return (false, "reply to \(id) too large: \(error.detail)") }
                o.writing = true
                return (true, "reply to \(id) too large: \(error.detail)")
            }
            if o.writing { return (false, nil) }
            o.writing = true
            return (true, nil)
        }
        if let failure { WorkerLog.write(failure) }
        guard queued else { return }
        // This thread writes until the outbox is empty, taking whatever other threads added meanwhile. Two
        // buffers rotate (pending <-> spare), so steady state allocates nothing.
        while true {
            var batch = outbox.withLock { o -> [UInt8] in
                if o.pending.isEmpty {
                    o.writing = false
                    return []
                }
                var taken = o.spare
                o.spare = []
                swap(&taken, &o.pending)
                return taken
            }
            if batch.isEmpty { return }
            // A typed-throws closure here crashes the 6.3 compiler (IRGen thunk); carry the error in a Result.
            let sent = batch.withUnsafeBytes { raw in Result { () throws(SystemError) in try sendAll(fd, raw) } }
            if case .failure(let error) = sent {
                WorkerLog.write("host connection lost: \(error)")
                exit(0)
            }
            batch.removeAll(keepingCapacity: true)
            outbox.withLock { $0.spare = batch }
        }
    }

    func register(_ context: ExtensionContext) { contexts.withLock { $0[context.requestID] = context } }
    func context(for id: RequestID) -> ExtensionContext? { contexts.withLock { $0[id] } }
    func remove(_ id: RequestID) { _ = contexts.withLock { $0.removeValue(forKey: id) } }
    var activeCount: Int { contexts.withLock { $0.count } }
}

enum WorkerRuntime {
    typealias SyncBody = @Sendable (ExtensionContext) -> Void
    typealias AsyncBody = @Sendable (ExtensionContext) async -> Void

    static func run(_ sync: SyncBody?, inline: Bool, async asyncBody: AsyncBody?) -> Never {
        let env = Environment()
        signal(SIGPIPE, SIG_IGN)
        // stdout is a pipe, so stdio would buffer `print()` in 4 KiB blocks that a crash or kill loses: one line
        // at a time instead, so each line reaches the host log as it is printed.
        sdk_line_buffer_stdout()
        // Dying with the host, the memory limit and the rest of the sandbox are the launcher's work
        // (sdk-host-launcher): they hold whether or not an extension links this runtime.
        let connection = HostConnection(fd: env.ipcFD)
        var reader = FrameReader()
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        var idleTimeoutMs = env.idleTimeoutMs
        var lastBegin = monotonicNanoseconds()

        while true {
            // The idle backstop is twice the host's idle timeout: the host retires us first in normal operation.
            var pfd = pollfd(fd: connection.fd, events: Int16(POLLIN), revents: 0)
            let timeout: Int32 = idleTimeoutMs > 0 ? Int32(min(idleTimeoutMs, 1000)) : 1000
            let ready = poll(&pfd, 1, timeout)
            if ready < 0 {
                if errno == EINTR { continue }
                WorkerLog.write("poll failed: \(String(cString: strerror(errno)))")
                exit(1)
            }
            if ready == 0 {
                if idleTimeoutMs > 0, connection.activeCount == 0,
                    monotonicNanoseconds() - lastBegin > UInt64(idleTimeoutMs) * 2_000_000
                {
                    exit(0)
                }
                continue
            }
            let n = buffer.withUnsafeMutableBytes { read(connection.fd, $0.baseAddress, $0.count) }
            if n == 0 { exit(0) }  // the host closed the connection
            if n < 0 {
                if errno == EINTR || errno == EAGAIN { continue }
                exit(0)
            }
            buffer.withUnsafeBytes { reader.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
            while true {
                let message: Message
                do {
                    guard let value = try reader.nextValue() else { break }
                    message = try Message(plist: value)
                } catch {
                    WorkerLog.write("protocol error from host: \(error); exiting")
                    exit(2)
                }
                switch message {
                case .hello(let version, _, _, let idle):
                    if version != protocolVersion {
                        WorkerLog.write("host speaks protocol \(version), we speak \(protocolVersion); exiting")
                        exit(2)
                    }
                    idleTimeoutMs = idle
                    connection.send(.welcome(version: protocolVersion, identifier: env.identifier, pid: getpid()))
                case .begin(let id, let items, _, _):
                    lastBegin = monotonicNanoseconds()
                    let context = ExtensionContext(requestID: id, inputItems: items) { [connection] message in
                        connection.remove(id)
                        connection.send(message)
                    }
                    connection.register(context)
                    if let sync {
                        if inline {
                            sync(context)
                        } else {
                            DispatchQueue.global().async { sync(context) }
                        }
                    } else if let asyncBody {
                        context.attach(Task.detached {
                            await asyncBody(context)
                            if !context.isFinished {
                                if context.isCancelled {
                                    context.cancelRequest(withError: .cancelledByHost)
                                } else {
                                    WorkerLog.write("handler returned without finishing request \(id)")
                                    context.cancelRequest(withError: ExtensionError(
                                        domain: "SDKExtension", code: 2,
                                        message: "the handler returned without completing the request"))
                                }
                            }
                        })
                    }
                case .cancel(let id):
                    connection.context(for: id)?.markCancelledByHost()
                case .ping(let seq):
                    connection.send(.pong(seq: seq))
                case .pong, .welcome, .complete, .cancelled, .connect, .connected, .assigned, .interrupted, .status,
                    .statusReport, .sandboxed, .launchFailed, .prewarm, .prewarmed:
                    WorkerLog.write("unexpected '\(message.typeName)' from host; ignored")
                case .error(let text, _):
                    WorkerLog.write("host reported: \(text)")
                case .unknown(let type):
                    WorkerLog.write("unknown message type '\(type)' from host; ignored")
                }
            }
        }
    }
}

/// What the host passes in the environment (see the host's WorkerProcess).
struct Environment {
    let ipcFD: Int32
    let identifier: String
    var idleTimeoutMs: Int64

    init() {
        func value(_ name: String) -> String? { getenv(name).map { String(cString: $0) } }
        ipcFD = value("SDKHOST_IPC_FD").flatMap { Int32($0) } ?? 3
        identifier = value("SDKHOST_EXTENSION_ID") ?? "unknown"
        idleTimeoutMs = value("SDKHOST_IDLE_TIMEOUT_MS").flatMap { Int64($0) } ?? 0
        var st = stat()
        if fstat(ipcFD, &st) != 0 {
            WorkerLog.write("no host connection on fd \(ipcFD): this program is an sdk-host extension; run it through sdk-host")
            exit(64)
        }
    }
}
