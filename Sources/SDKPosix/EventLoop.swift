// EventLoop: one thread, one epoll set. Descriptor handlers and timers belong to the loop thread; other threads
// hand it work through `execute`, which queues a closure and wakes the loop with an eventfd.

#if canImport(Glibc)
import Glibc
#endif
import CSDKShim
import Synchronization

/// A single-threaded epoll event loop with timers.
///
/// `@unchecked Sendable`: `handlers`, `timers` and `nextTimerID` are touched only on the loop thread (checked
/// with `preconditionInLoop`); cross-thread state (`inbox`) sits behind a Mutex; the rest is immutable.
public final class EventLoop: @unchecked Sendable {
    public typealias Handler = (_ events: UInt32) -> Void

    private let epfd: Int32
    private let wakeFD: Int32
    private var handlers: [Int32: Handler] = [:]
    private var timers = TimerHeap()
    private var beforeSleep: [() -> Void] = []
    private let inbox = Mutex<Inbox>(Inbox())
    private let loopThread = Atomic<UInt>(0)
    private let name: String

    private struct Inbox {
        var tasks: [() -> Void] = []
        var stopping = false
        var stopped = false
        var onStopped: [@Sendable () -> Void] = []
    }

    /// Readable.
    public static let readable = SDK_EPOLLIN | SDK_EPOLLRDHUP
    /// Writable.
    public static let writable = SDK_EPOLLOUT

    /// Creates the loop and starts its thread.
    public init(name: String) throws(SystemError) {
        self.name = name
        epfd = try retryingEINTR("epoll_create1") { sdk_epoll_create() }
        do throws(SystemError) {
            wakeFD = try retryingEINTR("eventfd") { sdk_eventfd() }
        } catch {
            FileDescriptor(adopting: epfd).close()
            throw error
        }
        try retryingEINTR("epoll_ctl(ADD)") { sdk_epoll_ctl(epfd, SDK_EPOLL_CTL_ADD, wakeFD, Self.readable) }
        let box = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        let rc = pthread_create(&thread, nil, { arg in
            let loop = Unmanaged<EventLoop>.fromOpaque(arg!).takeRetainedValue()
            loop.run()
            return nil
        }, box)
        guard rc == 0 else {
            Unmanaged<EventLoop>.fromOpaque(box).release()
            FileDescriptor(adopting: wakeFD).close()
            FileDescriptor(adopting: epfd).close()
            throw SystemError("pthread_create", errno: rc, detail: name)
        }
        pthread_detach(thread)
    }

    /// True on the loop's own thread.
    public var inLoop: Bool { loopThread.load(ordering: .acquiring) == UInt(pthread_self()) }

    /// Traps unless called on the loop thread.
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

    private func signalWake() {
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)  // EAGAIN means the counter is already non-zero: the loop will wake anyway
    }

    // MARK: Loop-thread API

    /// Watches `fd` for `events`, calling `handler` on the loop thread.
    public func register(_ fd: Int32, events: UInt32, handler: @escaping Handler) throws(SystemError) {
        preconditionInLoop()
        try retryingEINTR("epoll_ctl(ADD)", detail: "fd \(fd)") { sdk_epoll_ctl(epfd, SDK_EPOLL_CTL_ADD, fd, events) }
        handlers[fd] = handler
    }

    /// Changes the events watched on `fd`.
    public func modify(_ fd: Int32, events: UInt32) throws(SystemError) {
        preconditionInLoop()
        try retryingEINTR("epoll_ctl(MOD)", detail: "fd \(fd)") { sdk_epoll_ctl(epfd, SDK_EPOLL_CTL_MOD, fd, events) }
    }

    /// Stops watching `fd`. Call before closing it.
    public func unregister(_ fd: Int32) {
        preconditionInLoop()
        if handlers.removeValue(forKey: fd) != nil {
            _ = sdk_epoll_ctl(epfd, SDK_EPOLL_CTL_DEL, fd, 0)
        }
    }

    /// Runs `body` on the loop thread after `nanoseconds`. Returns an id for `cancelTimer`.
    @discardableResult
    public func schedule(afterNanoseconds nanoseconds: UInt64, _ body: @escaping () -> Void) -> TimerID {
        preconditionInLoop()
        return timers.insert(deadline: monotonicNanoseconds() &+ nanoseconds, body)
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
        timers.cancel(id)
    }

    // MARK: The loop

    /// The name every loop thread carries (visible in /proc/<pid>/task/*/comm), for leak checks and debuggers.
    public static let threadName = "sdk-host-loop"

    private func run() {
        loopThread.store(UInt(pthread_self()), ordering: .releasing)
        _ = sdk_set_thread_name(Self.threadName)
        var fds = [Int32](repeating: 0, count: 64)
        var events = [UInt32](repeating: 0, count: 64)
        while true {
            let (tasks, stopping) = inbox.withLock { inbox -> ([() -> Void], Bool) in
                defer { inbox.tasks.removeAll(keepingCapacity: true) }
                return (inbox.tasks, inbox.stopping)
            }
            for task in tasks { task() }
            if stopping && tasks.isEmpty { break }
            if !tasks.isEmpty { continue }  // tasks may have queued more; run them before sleeping
            while !beforeSleep.isEmpty {
                let hooks = beforeSleep
                beforeSleep.removeAll(keepingCapacity: true)
                for hook in hooks { hook() }
            }
            let timeout = timers.millisecondsUntilNext(now: monotonicNanoseconds())
            let n = fds.withUnsafeMutableBufferPointer { f in
                events.withUnsafeMutableBufferPointer { e in
                    sdk_epoll_wait(epfd, f.baseAddress, e.baseAddress, 64, timeout)
                }
            }
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
                } else if let handler = handlers[fd] {
                    handler(events[i])
                }
            }
            // Pop one at a time: a timer body may schedule or cancel timers, so it must not run inside an
            // access to the heap.
            let now = monotonicNanoseconds()
            while let body = timers.popExpired(now: now) { body() }
        }
        handlers.removeAll()
        timers = TimerHeap()
        beforeSleep.removeAll()
        let callbacks = inbox.withLock { inbox -> [@Sendable () -> Void] in
            inbox.stopped = true
            inbox.tasks.removeAll()
            defer { inbox.onStopped.removeAll() }  // they may hold what owns this loop
            return inbox.onStopped
        }
        FileDescriptor(adopting: wakeFD).close()
        FileDescriptor(adopting: epfd).close()
        loopThread.store(0, ordering: .releasing)
        for callback in callbacks { callback() }
    }
}

/// Identifies a scheduled timer.
public struct TimerID: Hashable, Sendable {
    let raw: UInt64
}

/// A min-heap of deadlines with cancellation by id (cancelled entries are skipped when they surface).
struct TimerHeap {
    private var heap: [(deadline: UInt64, id: UInt64)] = []
    private var bodies: [UInt64: () -> Void] = [:]
    private var nextID: UInt64 = 1

    mutating func insert(deadline: UInt64, _ body: @escaping () -> Void) -> TimerID {
        let id = nextID
        nextID += 1
        bodies[id] = body
        heap.append((deadline, id))
        var i = heap.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            if heap[parent].deadline <= heap[i].deadline { break }
            heap.swapAt(parent, i)
            i = parent
        }
        return TimerID(raw: id)
    }

    mutating func cancel(_ id: TimerID) {
        bodies.removeValue(forKey: id.raw)
        if bodies.isEmpty { heap.removeAll(keepingCapacity: true) }
    }

    /// -1 (wait forever) when no timer is pending; otherwise milliseconds rounded up.
    mutating func millisecondsUntilNext(now: UInt64) -> Int32 {
        while let top = heap.first, bodies[top.id] == nil { popTop() }
        guard let top = heap.first else { return -1 }
        if top.deadline <= now { return 0 }
        return Int32(min((top.deadline - now + 999_999) / 1_000_000, 60_000))
    }

    /// Removes and returns the body of the earliest timer due by `now`, skipping cancelled ones.
    mutating func popExpired(now: UInt64) -> (() -> Void)? {
        while let top = heap.first, top.deadline <= now {
            popTop()
            if let body = bodies.removeValue(forKey: top.id) { return body }
        }
        return nil
    }

    private mutating func popTop() {
        let last = heap.removeLast()
        guard !heap.isEmpty else { return }
        heap[0] = last
        var i = 0
        while true {
            let l = 2 * i + 1, r = l + 1
            var smallest = i
            if l < heap.count && heap[l].deadline < heap[smallest].deadline { smallest = l }
            if r < heap.count && heap[r].deadline < heap[smallest].deadline { smallest = r }
            if smallest == i { break }
            heap.swapAt(i, smallest)
            i = smallest
        }
    }
}
