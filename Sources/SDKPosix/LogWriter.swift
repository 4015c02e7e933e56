// LogWriter: log lines leave the event loop through a bounded buffer that one background thread writes out.
// A stalled stderr reader (a full pipe, a stopped terminal) used to block the loop on every log line; now the
// loop only appends to memory, and when the buffer is full the line is dropped and counted. The writer thread
// reports the count once it catches up. One writer per process, started on first use. What is still buffered
// when the process calls exit() is written first, for a bounded time (`flush`): a command that logged a line and
// then failed used to exit with the line unwritten (the line that said why).

#if canImport(Glibc)
import Glibc
#endif
import CSDKShim
import Synchronization

/// A bounded, non-blocking log sink for one descriptor.
public final class LogWriter: Sendable {
    /// The process's writer to stderr.
    public static let standardError = LogWriter(fd: 2, capacity: 1 << 20)

    private struct State {
        var pending: [UInt8] = []
        var dropped = 0
        var started = false
        /// The writer thread holds bytes it took and has not finished writing.
        var writing = false
        /// A flush gave up on a reader that did not read: later ones do not wait again (exit() after fail()).
        var stalled = false
    }

    private let fd: Int32
    private let capacity: Int
    private let state = Mutex(State())
    /// Counts wake-ups for the writer thread (an eventfd, blocking reads).
    private let wakeFD: Int32

    /// - Parameters:
    ///   - fd: Where lines go (not owned; never closed).
    ///   - capacity: Bytes buffered at most; a line that does not fit is dropped and counted.
    public init(fd: Int32, capacity: Int) {
        self.fd = fd
        self.capacity = capacity
        wakeFD = sdk_blocking_eventfd()
    }

    /// The name the writer thread carries (visible in /proc/<pid>/task/*/comm).
    public static let threadName = "sdk-host-log"

    /// Appends `line` (which should end in a newline); never blocks on the descriptor. Returns false if the
    /// buffer was full and the line was dropped.
    @discardableResult
    public func write(_ line: String) -> Bool {
        var line = line
        let (accepted, start, wake) = line.withUTF8 { bytes in
            state.withLock { s -> (Bool, Bool, Bool) in
                guard s.pending.count + bytes.count <= capacity else {
                    // Counted, and the writer woken to say so (with nothing pending it would not be).
                    s.dropped += 1
                    let start = !s.started
                    s.started = true
                    return (false, start, s.pending.isEmpty && s.dropped == 1)
                }
                // Only the line that finds the buffer empty wakes the writer: with lines pending, the writer is
                // awake or already woken, and it takes everything before it sleeps again.
                let wake = s.pending.isEmpty
                s.pending.append(contentsOf: bytes)
                let start = !s.started
                s.started = true
                return (true, start, wake)
            }
        }
        if start { startThread() }
        if wake {
            var one: UInt64 = 1
            _ = Glibc.write(wakeFD, &one, 8)
        }
        return accepted
    }

    /// Lines dropped since the writer last reported (for tests).
    public var droppedCount: Int { state.withLock { $0.dropped } }

    /// Bytes waiting to be written (for tests).
    public var pendingBytes: Int { state.withLock { $0.pending.count } }

    /// Waits until every line accepted so far is written, for at most `timeoutNanoseconds` (a reader that
    /// stopped reading cannot hold the caller for longer). Returns whether everything was written.
    @discardableResult
    public func flush(timeoutNanoseconds: UInt64) -> Bool {
        let deadline = monotonicNanoseconds() &+ timeoutNanoseconds
        while true {
            let (done, stalled) = state.withLock { ($0.pending.isEmpty && $0.dropped == 0 && !$0.writing, $0.stalled) }
            if done { return true }
            if stalled || monotonicNanoseconds() >= deadline {
                state.withLock { $0.stalled = true }
                return false
            }
            usleep(1000)
        }
    }

    private func startThread() {
        // The process's own stderr writer is flushed when the process exits (exit() runs this; a signal that
        // kills it does not): 1 s at most, so a stalled stderr does not hold the exit.
        if self === LogWriter.standardError {
            atexit { _ = LogWriter.standardError.flush(timeoutNanoseconds: 1_000_000_000) }
        }
        _ = startDetachedThread(named: LogWriter.threadName) { [self] in run() }
    }

    private func run() {
        while true {
            var counter: UInt64 = 0
            let n = read(wakeFD, &counter, 8)
            if n < 0 && errno != EINTR && errno != EAGAIN { usleep(10_000) }
            while true {
                let (bytes, dropped) = state.withLock { s -> ([UInt8], Int) in
                    let taken = (s.pending, s.dropped)
                    s.pending = []
                    s.dropped = 0
                    s.writing = !taken.0.isEmpty || taken.1 > 0
                    return taken
                }
                if bytes.isEmpty && dropped == 0 { break }
                writeAll(bytes)
                if dropped > 0 {
                    writeAll(Array("sdk-host: warning: \(dropped) log line(s) dropped: the log reader fell behind\n".utf8))
                }
                state.withLock { $0.writing = false }
            }
        }
    }

    private func writeAll(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, bytes.count - offset) }
            if n > 0 {
                offset += n
            } else if n < 0 && errno == EINTR {
                continue
            } else if n < 0 && errno == EAGAIN {
                usleep(1000)
            } else {
                return  // closed or broken: the lines are lost, the host is not
            }
        }
    }
}
