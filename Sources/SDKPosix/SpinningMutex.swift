// A lock for state that app threads share with the host's loop thread in critical sections of a few hundred
// nanoseconds (a dictionary lookup, a queue append). Synchronization.Mutex on Linux sleeps in the kernel
// (FUTEX_LOCK_PI) the moment it finds the lock held, so an API call could sleep because the loop thread was
// inside such a section; this one spins for about as long as a sleep and wake-up would take first
// (sdk_spin_lock), and sleeps only when the holder does not let go in that time (it was preempted).
import CSDKShim

public final class SpinningMutex<Value>: @unchecked Sendable {
    private let word: UnsafeMutablePointer<UInt32>
    private var value: Value

    public init(_ value: Value) {
        word = .allocate(capacity: 1)
        word.initialize(to: 0)
        self.value = value
    }

    deinit { word.deallocate() }

    /// Runs `body` with the value, holding the lock.
    @inline(__always)
    public func withLock<Result, E: Error>(_ body: (inout Value) throws(E) -> Result) throws(E) -> Result {
        sdk_spin_lock(word)
        defer { sdk_spin_unlock(word) }
        return try body(&value)
    }

    /// Runs `body` with the value if the lock is free now; nil if it is held.
    @inline(__always)
    public func withLockIfAvailable<Result, E: Error>(_ body: (inout Value) throws(E) -> Result) throws(E) -> Result? {
        guard sdk_spin_trylock(word) != 0 else { return nil }
        defer { sdk_spin_unlock(word) }
        return try body(&value)
    }
}
