// RunQueueProbe: whether the machine has more runnable threads than CPUs, read from /proc/loadavg, so that a busy
// poll can stop when its spinning would keep a thread that has work from a CPU.
//
// A poll yields between its checks, but `sched_yield` only lets threads of the caller's own scheduling group run
// (with autogroup, one per session: the app, the daemon and each worker are in different ones). Where two
// processes' loops share a CPU, each one's poll therefore holds the CPU for its whole budget while the other,
// which would give it work, waits; and a thread that has just run counts as cache-hot, so an idle second CPU does
// not take the waiting one. The run queue's length says when that happens, whichever group is waiting.

#if canImport(Glibc)
import Glibc
#endif

/// Reads the number of runnable threads on the machine (the fourth field of /proc/loadavg, `running/total`).
/// Loop-confined: owned by the thread that polls, opened when it starts and closed when it stops.
package struct RunQueueProbe {
    /// /proc/loadavg, or -1 when it cannot be read (no procfs; a sandboxed worker): then nothing is oversubscribed.
    private let fd: Int32
    /// More runnable threads than this means threads are waiting for a CPU that pollers hold.
    private let limit: Int

    package init() {
        fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC)
        // Pollers count themselves. With requests one at a time through the daemon, the app's, the daemon's and
        // the worker's pollers and the app's woken threads make four or five on two CPUs, and there polling pays:
        // stopping above CPUs + 1 made that path's round trip 15% slower (docs/BENCHMARKS.md); above CPUs + 2
        // it is unchanged.
        limit = max(1, sysconf(Int32(_SC_NPROCESSORS_ONLN))) + 2
    }

    /// Whether more threads are runnable than the CPUs plus two (false when it cannot tell).
    package func oversubscribed() -> Bool {
        guard fd >= 0 else { return false }
        return withUnsafeTemporaryAllocation(byteCount: 64, alignment: 8) { buffer -> Bool in
            let got = pread(fd, buffer.baseAddress, buffer.count, 0)
            guard got > 0, let running = Self.runnable(in: UnsafeRawBufferPointer(rebasing: buffer[..<got])) else {
                return false
            }
            return running > limit
        }
    }

    /// The `running` of `load1 load5 load15 running/total lastpid`, or nil if the text is not that.
    package static func runnable(in text: UnsafeRawBufferPointer) -> Int? {
        var spaces = 0
        var value = 0
        var digits = 0
        for byte in text {
            if byte == UInt8(ascii: " ") {
                spaces += 1
            } else if spaces == 3 {
                if byte == UInt8(ascii: "/") { return digits > 0 ? value : nil }
                guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9"), digits < 9 else { return nil }
                value = value * 10 + Int(byte - UInt8(ascii: "0"))
                digits += 1
            } else if spaces > 3 {
                return nil
            }
        }
        return nil
    }

    /// Closes the descriptor; called once, by the owner, when it stops polling.
    package func close() {
        if fd >= 0 { FileDescriptor(adopting: fd).close() }
    }
}
