// A lock for state that app threads share with the host's loop thread in critical sections of a few hundred
// nanoseconds (a dictionary lookup, a queue append). Synchronization.Mutex on Linux is a priority-inheritance
// futex lock: after a short spin a waiter sleeps in FUTEX_LOCK_PI, and on release the kernel hands the lock to
// that waiter, so nobody else may take it until the waiter has been woken and run. This one (sdk_spin_lock) is a
// plain three-state futex lock: a waiter spins, then sleeps, and a free lock goes to whoever takes it first.
// `sdk-host bench api` measured the difference: beginRequest p99.9 81-111 µs with Mutex, 17-36 µs with this,
// with 64 requests in flight (docs/BENCHMARKS.md).
import CSDKShim

public final class SpinningMutex<Value>: @unchecked Sendable {
    private let word: UnsafeMutablePointer<UInt32>
    /// `@exclusivity(unchecked)`: only `withLock` bodies touch it, one at a time (the lock), and a body that took the
    /// lock again would deadlock before any access check could see it; the runtime's check found nothing the
    /// lock does not already rule out, and cost a call per lock.
    @exclusivity(unchecked) private var value: Value

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
