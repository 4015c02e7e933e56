// KillOnTermination: processes to kill if this process is ended by SIGTERM, SIGINT or SIGHUP, or traps (a
// failed precondition, a fault), so that a test run or a benchmark stopped midway leaves no daemon of its own
// behind. The handler only reads a fixed array and calls kill(2), both safe in a signal handler, then dies of
// the same signal; on a trap, through the handler that was there before (the Swift runtime's backtracer, say).
// (SIGKILL cannot be caught.)

#if canImport(Glibc)
import Glibc
#endif
import Synchronization

package enum KillOnTermination {
    static let capacity = 64
    nonisolated(unsafe) static let pids: UnsafeMutablePointer<pid_t> = {
        let p = UnsafeMutablePointer<pid_t>.allocate(capacity: capacity)
        p.initialize(repeating: 0, count: capacity)
        for sig in [SIGTERM, SIGINT, SIGHUP] {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = { sig in
                KillOnTermination.killAll()
                signal(sig, SIG_DFL)
                raise(sig)
            }
            sigaction(sig, &action, nil)
        }
        for sig in crashSignals {
            var action = sigaction()
            // On the alternate stack where the runtime set one up: a stack overflow must reach the handler too.
            action.sa_flags = SA_SIGINFO | SA_ONSTACK
            action.__sigaction_handler.sa_sigaction = { sig, info, _ in
                KillOnTermination.killAll()
                // The handler that was there before takes it from here, restored now. A fault the kernel raised
                // (si_code > 0) happens again when this returns, with its own address; a raised signal (abort) is
                // raised again, and runs once this handler returns.
                sigaction(sig, KillOnTermination.previous + Int(sig), nil)
                if let info, info.pointee.si_code > 0 { return }
                raise(sig)
            }
            sigaction(sig, &action, previous + Int(sig))
        }
        return p
    }()
    static let crashSignals = [SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV]
    /// The actions the crash signals had before, by signal number.
    nonisolated(unsafe) static let previous: UnsafeMutablePointer<sigaction> = {
        let p = UnsafeMutablePointer<sigaction>.allocate(capacity: 32)
        p.initialize(repeating: sigaction(), count: 32)
        return p
    }()

    /// SIGKILL to every registered pid (only a read of a fixed array and kill(2): safe in a signal handler).
    static func killAll() {
        for i in 0..<capacity where pids[i] > 0 { kill(pids[i], SIGKILL) }
    }
    static let lock = Mutex(())

    /// Kills `pid` (SIGKILL) if this process is terminated before `remove(pid)`. Installs the handlers on first use.
    package static func add(_ pid: pid_t) {
        lock.withLock { _ in
            if let free = (0..<capacity).first(where: { pids[$0] == 0 }) { pids[free] = pid }
        }
    }

    /// Forgets `pid`: call it once the process is reaped, before its pid can be reused.
    package static func remove(_ pid: pid_t) {
        lock.withLock { _ in
            for i in 0..<capacity where pids[i] == pid { pids[i] = 0 }
        }
    }
}
