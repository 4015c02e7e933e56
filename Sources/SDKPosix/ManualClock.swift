// ManualClock: time that a test moves by hand (NIO's EmbeddedEventLoop idea), so deadlines, grace periods and
// heartbeats can be driven deterministically instead of waited for.
import Synchronization

/// A clock that only moves when told to. An `EventLoop` created with one fires its timers by this clock.
public final class ManualClock: Sendable {
    private let nanoseconds: Atomic<UInt64>

    /// Starts at `start` nanoseconds (non-zero, so that "0" never looks like an unset time).
    public init(start: UInt64 = 1_000_000_000) { nanoseconds = Atomic(start) }

    /// The current time in nanoseconds.
    public func now() -> UInt64 { nanoseconds.load(ordering: .acquiring) }

    /// Moves the clock forward. Call `EventLoop.wake()` afterwards so the loop looks at its timers.
    public func advance(by delta: UInt64) { nanoseconds.add(delta, ordering: .acquiringAndReleasing) }
}
