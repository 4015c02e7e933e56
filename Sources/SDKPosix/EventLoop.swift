// EventLoop: one thread, one epoll set. Descriptor handlers and timers belong to the loop; other threads hand it
// work through `execute`, which queues a closure and wakes the loop with an eventfd, or `executeInline`, which
// runs the closure on the calling thread when the loop is asleep in epoll_wait (saving the loop a wake-up).
//
// "Belong to the loop" means: touched only by whoever holds the loop's turn, a mutex the loop thread holds from
// the moment epoll_wait returns until it calls epoll_wait again. An inline caller takes the turn only when it is
// free (trylock) and nothing is queued, so everything handed to the loop still runs in the order it was handed.
//
// Timers wake the loop through a timerfd in its epoll set, armed for the earliest deadline and re-armed only when
// an earlier one appears. epoll_wait's own timeout could not be moved by an inline caller, which then had to wake
// the loop (eventfd write, a turn, epoll_wait again) whenever it set a timer earlier than the loop slept on. With
// requests one at a time the loop sleeps with no timer at all, so every request's deadline did that: one extra
// wake-up of the loop thread per request. Now the caller re-arms the timerfd at most, and not even that while an
// earlier (possibly stale) expiry is armed; a stale one costs one spurious turn.
//
// Busy polling: after a turn that found or did work, the loop polls without sleeping for a few tens of
// microseconds before it sleeps. A reply usually arrives within that time, and then neither side pays for waking
// a sleeping CPU (measured here: 15-20 us per wake-up of an idle vCPU, two per round trip; the whole raw round
// trip between two processes on one CPU is 12 us). Each empty poll yields the CPU, so a thread that has work on
// it runs first; an idle loop polls once for the budget, then sleeps until something happens. The same idea as
// Linux's busy_poll and Go's spinning scheduler threads. A yield does not reach threads of other processes'
// scheduling groups, so the poll also stops once more threads are runnable than the CPUs can take
// (RunQueueProbe.swift).

#if canImport(Glibc)
import Glibc
#endif
import CSDKShim
import Synchronization

/// A single-threaded epoll event loop with timers.
///
/// `@unchecked Sendable`: `handlers`, `timers`, `beforeSleep`, `armedAt` and `sleepsOnManualClock` are touched
/// only by the holder of the turn (checked with `preconditionInLoop`); cross-thread state (`inbox`) sits behind a
/// Mutex; the rest is immutable.
public final class EventLoop: @unchecked Sendable {
    public typealias Handler = (_ events: UInt32) -> Void

    // The turn's state below is `@exclusivity(unchecked)`: every access to it is one statement that calls no code
    // of anyone else's (no handler, timer body or hook runs inside one, and what a mutation drops is released after
    // it: `cancelTimer`, `stop`), so the runtime's access checks could never fire; they were a call per access,
    // ~1.5% of a simulated schedule.
    private let epfd: Int32
    private let wakeFD: Int32
    /// Expires at `armedAt`; in the epoll set. Unused under a manual clock.
    private let timerFD: Int32
    /// When `timerFD` expires (0: not armed). A timer cancelled since leaves it early, which only costs a turn.
    @exclusivity(unchecked) private var armedAt: UInt64 = 0
    @exclusivity(unchecked) private var handlers: [Int32: Handler] = [:]
    /// What is watched on simulated descriptors (SimulatedKernel.swift), which no epoll set can hold.
    @exclusivity(unchecked) private var simulated = SimulatedWatchList()
    /// Real descriptors registered besides the loop's own: a driven loop with none skips epoll_wait.
    @exclusivity(unchecked) private var realRegistrations = 0
    @exclusivity(unchecked) private var timers = TimerHeap()
    @exclusivity(unchecked) private var beforeSleep: [() -> Void] = []
    /// An empty buffer `runBeforeSleepHooks` hands `beforeSleep` while it runs what was there.
    @exclusivity(unchecked) private var spareHooks: [() -> Void] = []
    private let inbox = SpinningMutex<Inbox>(Inbox())
    /// The thread holding the turn (0: none): the loop thread while it is awake, or an inline caller.
    private let turnHolder = Atomic<UInt>(0)
    /// The loop's own thread (0 until it runs).
    private let loopThread = Atomic<UInt>(0)
    /// The turn itself (a plain pthread mutex: the loop holds it across a whole wake-up, not in one closure).
    private let turn: UnsafeMutablePointer<pthread_mutex_t>
    /// Under a manual clock: the loop thread sleeps in epoll_wait (rather than polls), so an inline caller that
    /// scheduled a timer knows to wake it (the test moves the clock; no timerfd can follow it).
    @exclusivity(unchecked) private var sleepsOnManualClock = false
    private let name: String
    private let clock: ManualClock?
    /// How long to poll before sleeping after a turn that found or did work (0: sleep at once).
    private let busyPollNanoseconds: UInt64
    /// Whether the last turn found or did work (loop thread only): an idle loop does not poll again.
    @exclusivity(unchecked) private var lastWaitFoundWork = false
    /// `run`'s buffers, kept between the turns of a driven loop (`runUntilIdle` enters `run` at every call; three
    /// new arrays each time were ~1% of a simulated schedule). Touched by `run` alone.
    @exclusivity(unchecked) private var runBuffers = RunBuffers()
    private let busyPollHitCount = Atomic<Int>(0)
    /// Waits that busy polling answered without sleeping (for tests and diagnostics).
    package var busyPollHits: Int { busyPollHitCount.load(ordering: .relaxed) }
    private let busyPollMissCount = Atomic<Int>(0), busyPollCutCount = Atomic<Int>(0)
    /// Polls that ran their whole budget, never stopped early for an oversubscribed machine, and found nothing;
    /// and polls stopped early because the machine was oversubscribed.
    package var busyPollMisses: Int { busyPollMissCount.load(ordering: .relaxed) }
    package var busyPollCuts: Int { busyPollCutCount.load(ordering: .relaxed) }

    private struct Inbox {
        var tasks = Deque<@Sendable () -> Void>()
        var stopping = false
        var stopped = false
        var onStopped: [@Sendable () -> Void] = []
    }

    /// Readable.
    public static let readable = SDK_EPOLLIN | SDK_EPOLLRDHUP
    /// Writable.
    public static let writable = SDK_EPOLLOUT
    /// Hang-up or error: reported whatever events were asked for.
    public static let hangUp: UInt32 = 0x10 | 0x08  // EPOLLHUP | EPOLLERR

    /// Creates the loop and starts its thread.
    ///
    /// - Parameters:
    ///   - clock: A clock that a test advances by hand; timers then fire only when it says so (and `wake()` is
    ///     called). Nil for the monotonic clock.
    ///   - busyPollMicroseconds: After a turn that found or did work, how long to poll (yielding the CPU between
    ///     polls) before sleeping; 0 sleeps at once. Not used under a manual clock.
    ///   - driven: No thread of its own: the caller runs it, a turn at a time, with `runUntilIdle()` (the
    ///     simulation's one thread). Needs a manual clock.
    public init(name: String, clock: ManualClock? = nil, busyPollMicroseconds: Int = 0, driven: Bool = false) throws(SystemError) {
        precondition(!driven || clock != nil, "a driven event loop needs a manual clock")
        self.name = name
        self.clock = clock
        self.driven = driven
        busyPollNanoseconds = UInt64(max(0, busyPollMicroseconds)) * 1000
        let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        turn = mutex
        // Until all three descriptors exist, a failure undoes what was made. After that, deinit does (the thread
        // has not started), should epoll_ctl or pthread_create fail.
        var made: [Int32] = []
        func make(_ what: String, _ call: () -> Int32) throws(SystemError) -> Int32 {
            do throws(SystemError) {
                let fd = try retryingEINTR(what, call)
                made.append(fd)
                return fd
            } catch {
                for fd in made { FileDescriptor(adopting: fd).close() }
                pthread_mutex_destroy(mutex)
                mutex.deallocate()
                throw error
            }
        }
        epfd = try make("epoll_create1") { sdk_epoll_create() }
        wakeFD = try make("eventfd") { sdk_eventfd() }
        timerFD = try make("timerfd_create") { sdk_timerfd() }
        try retryingEINTR("epoll_ctl(ADD)") { sdk_epoll_ctl(epfd, SDK_EPOLL_CTL_ADD, wakeFD, Self.readable) }
        try retryingEINTR("epoll_ctl(ADD)") { sdk_epoll_ctl(epfd, SDK_EPOLL_CTL_ADD, timerFD, Self.readable) }
        if driven { return }
        let rc = startDetachedThread(named: Self.threadName) { [self] in run() }
        // The thread never ran: its closure held the last reference, and deinit closes the descriptors.
        guard rc == 0 else { throw SystemError("pthread_create", errno: rc, detail: name) }
    }

    deinit {
        // The loop thread closes the epoll descriptor when it stops; a loop whose thread never started has it open.
        _ = Glibc.close(wakeFD)
        if !threadStarted || (driven && !drivenStopped) {  // a driven loop dropped before it stopped too
            _ = Glibc.close(epfd)
            _ = Glibc.close(timerFD)
        }
        pthread_mutex_destroy(turn)
        turn.deallocate()
    }

    @exclusivity(unchecked) private var threadStarted = false
    /// Run by its caller (`runUntilIdle`), not by a thread of its own.
    private let driven: Bool
    /// A driven loop that has stopped and released everything.
    @exclusivity(unchecked) private var drivenStopped = false

    /// True while an `executeInline` task runs on its caller's thread (read by the turn's holder). Code that would
    /// call out to an app (a completion handler) or start slow work from such a task hands it to the loop thread
    /// with `execute` instead: the caller is inside an API call that must return at once.
    public private(set) var runningInline = false

    /// Runs `body` now, or, inside an `executeInline` task on an app's thread, on the loop thread soon (what would
    /// call out to the app must not run inside the app's own call).
    public func runOutsideInlineTask(_ body: @escaping @Sendable () -> Void) {
        if runningInline, execute(body) { return }
        body()
    }

    /// True on the thread that holds the loop's turn: the loop thread while it is awake, or a caller inside
    /// `executeInline`.
    public var inLoop: Bool { turnHolder.load(ordering: .relaxed) == UInt(pthread_self()) }

    /// True on the loop's own thread only (not in a caller's `executeInline`): the one thread that lives as long
    /// as the loop, so that what must outlive the calling thread (a child's parent-death signal follows the
    /// thread that spawned it) is done here. A driven loop's thread is the one that runs `runUntilIdle`.
    public var onLoopThread: Bool { loopThread.load(ordering: .relaxed) == UInt(pthread_self()) }

    /// Traps unless called by the holder of the loop's turn.
    @inline(__always)
    public func preconditionInLoop(_ function: StaticString = #function) {
        precondition(inLoop, "\(function) must run on event loop '\(name)'")
    }

    /// Runs `task` on the loop thread, soon. Callable from any thread; never blocks.
    /// Returns false if the loop has stopped (the task is dropped).
    @discardableResult
    public func execute(_ task: @escaping @Sendable () -> Void) -> Bool {
        let (accepted, wake) = inbox.withLock { inbox -> (Bool, Bool) in
            if inbox.stopped { return (false, false) }
            inbox.tasks.append(task)
            return (true, inbox.tasks.count == 1)
        }
        if wake { signalWake() }
        return accepted
    }

    /// Runs `task` now on the calling thread if the loop is asleep, nothing is queued for it and `allowed` (asked
    /// holding the loop's turn, so it may read the loop's state) says so; else as `execute` does. Either way tasks
    /// run one at a time, in the order they were handed over, with the loop's state theirs alone; writes queued
    /// with `runBeforeSleeping` are flushed before this returns. Saves the loop thread a wake-up (and the caller a
    /// hand-off) for work that ends in a syscall anyway, such as writing a frame. Never blocks: a busy loop means
    /// the task is queued. A task run inline must not wait for the loop.
    ///
    /// `asLoop`: the caller is a thread of the library's own, not an app's, so the task runs as it would on the
    /// loop thread (`runningInline` stays false): what it hands to an app, or starts, is not sent over to the loop.
    @discardableResult
    public func executeInline(when allowed: () -> Bool = { true }, asLoop: Bool = false,
                              _ task: @escaping @Sendable () -> Void) -> Bool {
        guard pthread_mutex_trylock(turn) == 0 else { return execute(task) }
        let free = inbox.withLock { !$0.stopping && !$0.stopped && $0.tasks.isEmpty }
        guard free else {
            pthread_mutex_unlock(turn)
            return execute(task)
        }
        turnHolder.store(UInt(pthread_self()), ordering: .relaxed)
        guard allowed() else {
            releaseTurn()
            return execute(task)
        }
        runningInline = !asLoop
        task()
        runBeforeSleepHooks()
        runningInline = false
        // A timer set here expires through the timerfd; only a manual clock's loop must be woken to look (or
        // the loop itself, should the timerfd refuse to be armed).
        let wake = clock != nil ? sleepsOnManualClock && timers.nextDeadline != nil : !armTimer()
        releaseTurn()
        if wake { signalWake() }
        return true
    }

    /// Stops the loop after the tasks queued so far; `whenStopped` runs on the loop thread after its last task,
    /// once handlers and timers are dropped and its descriptors closed.
    public func stop(whenStopped: (@Sendable () -> Void)? = nil) {
        let wake = inbox.withLock { inbox -> Bool in
            if let whenStopped { inbox.onStopped.append(whenStopped) }
            if inbox.stopping { return false }
            inbox.stopping = true
            return true
        }
        if wake { signalWake() }
    }

    /// Wakes the loop so it looks at its timers again (after a test advanced its manual clock).
    public func wake() { signalWake() }

    private func signalWake() {
        // A driven loop looks at its queue each time it is run, and it runs on its caller's thread: no wake-up.
        if driven { return }
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)  // EAGAIN means the counter is already non-zero: the loop will wake anyway
    }

    // MARK: Loop-thread API

    /// Watches `fd` for `events`, calling `handler` on the loop thread.
    public func register(_ fd: Int32, events: UInt32, handler: @escaping Handler) throws(SystemError) {
        preconditionInLoop()
        if SimulatedKernel.isSimulated(fd) {
            try simulated.add(fd, events)
        } else {
            try retryingEINTR("epoll_ctl(ADD)", detail: "fd \(fd)") { sdk_epoll_ctl(epfd, SDK_EPOLL_CTL_ADD, fd, events) }
            realRegistrations += 1
        }
        // A handler this replaces (a real descriptor closed unregistered, its number reused) is released after the
        // dictionary's mutation, as every closure the loop drops is.
        let replaced = handlers.updateValue(handler, forKey: fd)
        withExtendedLifetime(replaced) {}
    }

    /// Changes the events watched on `fd`.
    public func modify(_ fd: Int32, events: UInt32) throws(SystemError) {
        preconditionInLoop()
        if SimulatedKernel.isSimulated(fd) { return try simulated.modify(fd, events) }
        try retryingEINTR("epoll_ctl(MOD)", detail: "fd \(fd)") { sdk_epoll_ctl(epfd, SDK_EPOLL_CTL_MOD, fd, events) }
    }

    /// Stops watching `fd`. Call before closing it.
    public func unregister(_ fd: Int32) {
        preconditionInLoop()
        if handlers.removeValue(forKey: fd) != nil {
            if SimulatedKernel.isSimulated(fd) {
                simulated.remove(fd)
            } else {
                _ = sdk_epoll_ctl(epfd, SDK_EPOLL_CTL_DEL, fd, 0)
                realRegistrations -= 1
            }
        }
    }

    /// Runs `body` on the loop thread after `nanoseconds`. Returns an id for `cancelTimer`.
    @discardableResult
    public func schedule(afterNanoseconds nanoseconds: UInt64, _ body: @escaping () -> Void) -> TimerID {
        preconditionInLoop()
        let (deadline, overflow) = now.addingReportingOverflow(nanoseconds)
        return timers.insert(deadline: overflow ? .max : deadline, body)
    }

    /// Runs `body` on the loop thread once the loop has handled everything ready and is about to wait again.
    /// Writers use it to coalesce everything queued in one loop iteration into one syscall.
    public func runBeforeSleeping(_ body: @escaping () -> Void) {
        preconditionInLoop()
        beforeSleep.append(body)
    }

    /// Cancels a timer that has not fired yet; cancelling a fired or unknown timer does nothing.
    public func cancelTimer(_ id: TimerID) {
        preconditionInLoop()
        // Released here, after the heap's mutation: its captures' deinits may use the loop.
        let body = timers.cancel(id)
        withExtendedLifetime(body) {}
    }

    // MARK: The loop

    /// The name every loop thread carries (visible in /proc/<pid>/task/*/comm), for leak checks and debuggers.
    public static let threadName = "sdk-host-loop"

    /// Tasks run per turn of the loop before it polls descriptors again, so a thread that keeps handing work in
    /// cannot starve I/O (NIO runs queued tasks in bounded batches the same way).
    public static let tasksPerTurn = 1024
    /// Expired timers run per turn, for the same reason.
    public static let timersPerTurn = 1024

    /// Timers pending (loop thread; for leak checks in tests).
    public var pendingTimerCount: Int {
        preconditionInLoop()
        return timers.count
    }

    /// The loop's clock in nanoseconds: `monotonicNanoseconds` unless a test drives time by hand.
    public var now: UInt64 { clock?.now() ?? monotonicNanoseconds() }

    /// epoll_wait(2) into `run`'s buffers, 64 at most. The buffers are parameters, not captures: `run`'s arrays
    /// captured by a nested function made every access to them a checked one, two runtime calls a turn.
    @inline(__always)
    private static func wait(_ epfd: Int32, _ fds: inout [Int32], _ events: inout [UInt32], _ timeout: Int32) -> Int32 {
        fds.withUnsafeMutableBufferPointer { f in events.withUnsafeMutableBufferPointer { e in wait(epfd, f, e, timeout) } }
    }

    /// The same into buffers already held (the busy poll's, which waits many times).
    @inline(__always)
    private static func wait(_ epfd: Int32, _ fds: UnsafeMutableBufferPointer<Int32>, _ events: UnsafeMutableBufferPointer<UInt32>,
                             _ timeout: Int32) -> Int32 {
        sdk_epoll_wait(epfd, fds.baseAddress, events.baseAddress, 64, timeout)
    }

    private func runBeforeSleepHooks() {
        // The hooks are taken whole, leaving a spare empty buffer for those they add; neither buffer is copied or
        // made again (a copy, then `removeAll(keepingCapacity:)` of the shared buffer, was ~1% of a schedule). A
        // local array, not a field: a hook that runs the hooks again (an inline task's flush) takes only its own.
        while !beforeSleep.isEmpty {
            var hooks: [() -> Void] = []
            swap(&hooks, &spareHooks)
            swap(&hooks, &beforeSleep)
            for hook in hooks { hook() }
            hooks.removeAll(keepingCapacity: true)
            spareHooks = hooks
        }
    }

    /// Takes the turn on the loop thread, after epoll_wait. An inline caller holds it only for one short task,
    /// so spin briefly before sleeping on the mutex.
    private func takeTurn() {
        var spins = 0
        while pthread_mutex_trylock(turn) != 0 {
            spins += 1
            if spins >= 200 {
                pthread_mutex_lock(turn)
                break
            }
        }
        turnHolder.store(UInt(pthread_self()), ordering: .relaxed)
        sleepsOnManualClock = false
    }

    /// Arms the timerfd for the earliest deadline unless it already expires no later. Holder of the turn only.
    /// False if timerfd_settime failed (it has no failure for valid arguments; the loop then polls instead).
    @discardableResult
    private func armTimer() -> Bool {
        guard let deadline = timers.nextDeadline, armedAt == 0 || deadline < armedAt else { return true }
        guard sdk_timerfd_arm(timerFD, deadline) == 0 else { return false }
        armedAt = deadline
        return true
    }

    private func releaseTurn() {
        turnHolder.store(0, ordering: .relaxed)
        pthread_mutex_unlock(turn)
    }

    /// A driven loop (`init(driven: true)`): runs turns on the calling thread, which becomes the loop's thread,
    /// until nothing is left to do now: no task queued, no descriptor ready, no timer due on the manual clock.
    /// Returns false once the loop has stopped (it then has released everything, and runs nothing more).
    @discardableResult
    public func runUntilIdle() -> Bool {
        precondition(driven, "runUntilIdle is for a driven loop")
        guard !drivenStopped else { return false }
        run()
        return !drivenStopped
    }

    /// Runs the loop's turns on the calling thread, which becomes the loop's: its own thread's loop returns once
    /// stopped; a driven one also when idle (with the turn released).
    private func run() {
        loopThread.store(UInt(pthread_self()), ordering: .relaxed)
        takeTurn()
        threadStarted = true
        let runQueue = busyPollNanoseconds > 0 && clock == nil ? RunQueueProbe() : nil
        // Taken out of `runBuffers` (not copied: no reference stays behind to make a write copy them) and put back.
        var fds: [Int32] = [], events: [UInt32] = [], batch: [@Sendable () -> Void] = []
        swap(&fds, &runBuffers.fds)
        swap(&events, &runBuffers.events)
        swap(&batch, &runBuffers.batch)
        defer {
            swap(&fds, &runBuffers.fds)
            swap(&events, &runBuffers.events)
            swap(&batch, &runBuffers.batch)
        }
        if fds.isEmpty {
            fds = [Int32](repeating: 0, count: 64)
            events = [UInt32](repeating: 0, count: 64)
            batch.reserveCapacity(Self.tasksPerTurn)
        }
        while true {
            let (more, stopping) = inbox.withLock { inbox -> (Bool, Bool) in
                while batch.count < Self.tasksPerTurn, let task = inbox.tasks.popFirst() { batch.append(task) }
                return (!inbox.tasks.isEmpty, inbox.stopping)
            }
            let ranTasks = !batch.isEmpty
            for task in batch { task() }
            batch.removeAll(keepingCapacity: true)
            if stopping && !ranTasks && !more { break }
            runBeforeSleepHooks()
            // Work still queued: poll without sleeping, so descriptors get their turn between batches.
            let timeout: Int32
            if ranTasks || more {
                timeout = 0
            } else if let clock {
                timeout = timers.nextDeadline.map { $0 <= clock.now() ? 0 : -1 } ?? -1
            } else if let next = timers.nextDeadline, next <= monotonicNanoseconds() {
                timeout = 0
            } else {
                timeout = armTimer() ? -1 : 1  // unarmed, poll each millisecond rather than miss a deadline
            }
            // Under a manual clock any timer may be due at once (the test moves the clock), so an inline caller
            // wakes the loop whenever a timer is pending.
            sleepsOnManualClock = clock != nil && timeout != 0
            releaseTurn()
            var n: Int32 = 0
            if driven {
                // Nothing is queued and no timer is due: if no descriptor is ready either, the caller gets its
                // turn back. Only the loop's own descriptors in its epoll set: none can be ready (no wake-ups, no
                // timerfd under a manual clock), so it is not asked.
                n = realRegistrations > 0 ? Self.wait(epfd, &fds, &events, 0) : 0
                if n >= 0, !simulated.isEmpty {
                    n = simulated.ready(into: &fds, &events, after: Int(n), hangUp: Self.hangUp)
                }
                if n == 0 && timeout != 0 { return }
            } else if timeout != 0, busyPollNanoseconds > 0, clock == nil, lastWaitFoundWork {
                let epfd = epfd, busyPollNanoseconds = busyPollNanoseconds
                var cut = false
                n = fds.withUnsafeMutableBufferPointer { f in
                    events.withUnsafeMutableBufferPointer { e in
                        busyPoll(nanoseconds: busyPollNanoseconds, stopsWhen: {
                            cut = runQueue?.oversubscribed() ?? false
                            return cut
                        }) {
                            Self.wait(epfd, f, e, 0)
                        }
                    }
                }
                if n > 0 {
                    busyPollHitCount.add(1, ordering: .relaxed)
                } else if n == 0 && cut {
                    busyPollCutCount.add(1, ordering: .relaxed)
                } else if n == 0 {
                    busyPollMissCount.add(1, ordering: .relaxed)
                }
            }
            if n == 0 && !driven { n = Self.wait(epfd, &fds, &events, timeout) }
            // A turn that ran tasks polls afterwards too (its wait had timeout 0 and may well have found nothing).
            lastWaitFoundWork = n > 0 || timeout == 0
            takeTurn()
            if n < 0 {
                let e = errno
                if e == EINTR { continue }
                fatalError("epoll_wait on loop '\(name)': \(String(cString: strerror(e)))")
            }
            for i in 0..<Int(n) {
                let fd = fds[i]
                if fd == wakeFD {
                    var counter: UInt64 = 0
                    _ = read(wakeFD, &counter, 8)
                } else if fd == timerFD {
                    var expirations: UInt64 = 0
                    _ = read(timerFD, &expirations, 8)
                    armedAt = 0
                } else if let handler = handlers[fd] {
                    handler(events[i])
                }
            }
            // Pop one at a time: a timer body may schedule or cancel timers, so it must not run inside an
            // access to the heap.
            let now = self.now
            var fired = 0
            while fired < Self.timersPerTurn, let body = timers.popExpired(now: now) {
                body()
                fired += 1
            }
        }
        // Stopped: no task is accepted from here on (`execute` returns false and its caller handles that), and
        // every task accepted before now runs, so nothing handed to the loop is silently dropped.
        while let leftovers = inbox.withLock({ inbox -> Deque<@Sendable () -> Void>? in
            if inbox.tasks.isEmpty {
                inbox.stopped = true
                return nil
            }
            defer { inbox.tasks = Deque() }
            return inbox.tasks
        }) {
            var leftovers = leftovers
            while let task = leftovers.popFirst() { task() }
        }
        // What the last turn and the leftovers left for the end of the turn still runs: it may hand outcomes on.
        runBeforeSleepHooks()
        // Released after the fields are emptied, not while one is being written: a capture's deinit may use the loop.
        let released = (handlers, timers, beforeSleep)
        handlers = [:]
        simulated = SimulatedWatchList()
        timers = TimerHeap()
        beforeSleep = []
        withExtendedLifetime(released) {}
        let callbacks = inbox.withLock { inbox -> [@Sendable () -> Void] in
            defer { inbox.onStopped.removeAll() }  // they may hold what owns this loop
            return inbox.onStopped
        }
        // The wake descriptor stays open until deinit: a thread in `execute` or `wake` may still write to it, and
        // closed here its number could be reused by the app and receive those 8 bytes. Only the turn's holder arms
        // the timerfd, and no one takes the turn for a stopped loop's work.
        FileDescriptor(adopting: epfd).close()
        FileDescriptor(adopting: timerFD).close()
        runQueue?.close()
        if driven { drivenStopped = true }
        releaseTurn()
        for callback in callbacks { callback() }
    }
}

/// Calls `poll` (a wait that does not block) until it returns non-zero or `nanoseconds` have passed, yielding the
/// CPU between calls so that a thread with work on this CPU runs first; returns `poll`'s last result. The busy
/// polling of the host's loop and of the worker runtime (see the top of this file).
/// `contended` is asked after the first empty poll and every fourth after it; when it says yes, polling stops
/// early (RunQueueProbe.swift says why).
@inline(__always)
package func busyPoll(nanoseconds: UInt64, stopsWhen contended: () -> Bool = { false }, _ poll: () -> Int32) -> Int32 {
    let until = monotonicNanoseconds() + nanoseconds
    var misses = 0
    while true {
        let n = poll()
        if n != 0 || monotonicNanoseconds() >= until { return n }
        misses += 1
        if misses & 3 == 1, contended() { return n }
        sched_yield()
    }
}

/// The arrays a loop's `run` works in (EventLoop.runBuffers).
private struct RunBuffers {
    var fds: [Int32] = []
    var events: [UInt32] = []
    var batch: [@Sendable () -> Void] = []
}
