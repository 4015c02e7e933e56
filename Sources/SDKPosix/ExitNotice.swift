// Exit notices: learning that a worker is dying before the kernel has torn it down.
//
// A killed process's pidfd becomes readable, and its socket reaches end-of-file, only once the kernel has unmapped
// all of its memory, which on this VM takes ~0.1 ms per resident MiB on top of ~0.15 ms (docs/BENCHMARKS.md). The
// kernel does one thing for a dying thread before that teardown: it walks the thread's robust-futex list, marks
// every futex word the thread owns FUTEX_OWNER_DIED and wakes a waiter. So the host shares one page with each
// worker (a sealed memfd on the worker's descriptor 5); the worker's runtime stores its main thread's id in the
// page's first word and links that word into the main thread's robust list (`sdk_exit_notice_register`); and one
// thread here waits on every watched word at once (futex_waitv). When a word changes, its owner is told, and the
// engine asks /proc whether the process really is exiting and with what status.
//
// The worker can write its page as it likes. The host only ever loads and compare-and-swaps its first word, the
// page can be neither shrunk nor grown (no SIGBUS here), a word that changes while its process is not exiting
// only stops the watch, and a worker that wakes its word without changing it is dropped after a few wake-ups.
// Either way that worker's death is seen the ordinary way, through its pidfd.

#if canImport(Glibc)
import Glibc
#endif
import CSDKShim
import Synchronization

/// One page shared with one worker: a one-page memfd sealed against shrinking, growing and further seals, mapped
/// shared. Its first word is the worker's robust futex. Unmapped when the last reference goes. (The simulation's
/// fake workers have `unshared` ones: its two words on the heap.)
public final class ExitNoticePage: @unchecked Sendable {
    /// The futex word. Loaded and swapped atomically only: the worker writes it too.
    let word: UnsafeMutablePointer<UInt32>
    /// The worker's pid, which is also its main thread's id (set once, before the page is shared with a thread):
    /// what /proc is asked about.
    public internal(set) var owner: pid_t = 0
    /// The id the worker stores in the word: its pid as it sees it. The same as `owner`, except for a worker in a
    /// pid namespace of its own (`moved(to:seenInsideAs:)`).
    public internal(set) var ownID: pid_t = 0

    /// The worker's descriptor the page is passed on (SDKHOST_EXIT_NOTICE_FD).
    public static let descriptor = Int32(SDK_EXIT_NOTICE_FD)

    /// FUTEX_WAITERS: the kernel wakes a waiter of a dead owner's word only when this bit is set.
    static let waitersBit: UInt32 = 0x8000_0000

    /// The page is ordinary heap memory (`unshared`), not a mapping.
    private let onHeap: Bool

    private init(word: UnsafeMutablePointer<UInt32>, onHeap: Bool = false) {
        self.word = word
        self.onHeap = onHeap
    }

    /// A new page and its memfd (close-on-exec) for the child.
    package static func create() throws(SystemError) -> (ExitNoticePage, Int32) {
        var raw: UnsafeMutableRawPointer?
        let fd = sdk_exit_notice_create(&raw)
        guard fd >= 0, let raw else { throw SystemError("memfd_create", errno: errno, detail: "exit-notice page") }
        return (ExitNoticePage(word: raw.assumingMemoryBound(to: UInt32.self)), fd)
    }

    /// A page no process shares (zeroed heap memory, no memfd): the simulation's fake workers', which have no
    /// process to pass a memfd to (a mapping each cost two syscalls and a page fault). Only the two words the
    /// host reads (`value`, `launcherStatus`), on a cache line: no process writes the rest, and zeroing 4 KiB for
    /// every fake worker was ~1% of a simulated schedule.
    package static func unshared() -> ExitNoticePage {
        let raw = UnsafeMutableRawPointer.allocate(byteCount: unsharedBytes, alignment: unsharedBytes)
        raw.initializeMemory(as: UInt8.self, repeating: 0, count: unsharedBytes)
        return ExitNoticePage(word: raw.bindMemory(to: UInt32.self, capacity: unsharedBytes / 4), onHeap: true)
    }
    private static let unsharedBytes = 64

    deinit {
        if onHeap { UnsafeMutableRawPointer(word).deallocate() } else { munmap(UnsafeMutableRawPointer(word), Int(SDK_EXIT_NOTICE_BYTES)) }
    }

    /// What the word holds now.
    public var value: UInt32 { sdk_atomic_load_u32(word) }

    /// Whether the worker has registered the word: it holds the worker's pid (with or without the waiters bit).
    public var isRegistered: Bool { ownID > 0 && value & ~Self.waitersBit == UInt32(ownID) }

    /// The value the word holds while its owner lives and the watcher waits on it.
    var armed: UInt32 { UInt32(ownID) | Self.waitersBit }

    /// The worker's status as its launcher left it in the page's second word (a set high bit, then the wait
    /// status) just before it reaped the worker: the status of a worker already reaped, whose /proc is gone.
    /// The worker can write that word too, but is only asked about once it is dead, so it could at most
    /// misname its own death.
    public var launcherStatus: ExitStatus? {
        let raw = sdk_atomic_load_u32(word + 1)
        return raw & 0x8000_0000 != 0 ? ExitStatus(waitStatus: Int32(raw & 0xFFFF)) : nil
    }

    /// The worker turned out to be `pid` (a child of the host's child, which is its launcher), pid `inside` in its
    /// own pid namespace. Call before the page is watched.
    public func moved(to pid: pid_t, seenInsideAs inside: pid_t) {
        owner = pid
        ownID = inside
    }

    /// Sets the waiters bit on a registered word. False if the word holds anything else.
    func arm() -> Bool {
        if sdk_atomic_cas_u32(word, UInt32(ownID), armed) != 0 { return true }
        return value == armed
    }
}

/// What watches exit-notice pages for the engine: `ExitNoticeWatcher.shared`, or the simulation's stand-in,
/// which reports notices when its seeded schedule says.
public protocol ExitNoticeWatching: AnyObject, Sendable {
    /// Watches `page`; `notice` runs once when the word changes or the watch gives up. False if not watched.
    func watch(_ page: ExitNoticePage, notice: @escaping @Sendable (ExitNoticeWatcher.Notice) -> Void) -> Bool
    /// Ends a watch; its `notice` will not run after this returns (unless it is running now).
    func unwatch(_ page: ExitNoticePage)
}

/// The thread that waits on every watched exit-notice word. One per process, started by the first `watch` and
/// ended after `idleSeconds` with nothing to watch, so a process that stops hosting keeps no thread.
public final class ExitNoticeWatcher: ExitNoticeWatching, @unchecked Sendable {
    /// What a watch reports, once, on the watcher's thread; the watch has ended when it is called.
    public enum Notice: Sendable, Equatable {
        /// The word changed and the process is exiting (its main thread is), with this status.
        case exiting(ExitStatus)
        /// The word changed, but the process is not exiting: it wrote its own page.
        case notExiting
        /// The word changed; /proc/<pid>/stat could not be read (this errno).
        case unreadable(Int32)
        /// The word was woken `spuriousWakeLimit` times without changing: no longer watched.
        case tooManyWakeups
    }

    public static let shared = ExitNoticeWatcher()
    public static let threadName = "sdk-host-exits"
    /// futex_waitv takes at most 128 words; one is the watcher's own control word.
    public static let capacity = 127
    /// Wake-ups without a change a worker may cause before its watch ends.
    public static let spuriousWakeLimit = 64
    /// How long the thread lingers with nothing to watch.
    package static let idleSeconds: Int32 = 5

    private struct Watch {
        let page: ExitNoticePage
        let notice: @Sendable (Notice) -> Void
        var spurious = 0
        /// /proc/<pid>/stat, opened by the watcher's thread once it has the watch (an open there cost ~35 us of
        /// the ~70 us a notice took to read it, on this VM), so that a notice only reads it. -1 until then.
        var stat: Int32 = -1
        var statOpened = false
    }

    private struct State {
        var watches: [ObjectIdentifier: Watch] = [:]
        var running = false
    }

    private let state = Mutex(State())
    /// Bumped (and woken) whenever the watched set changes, so the thread waits on the new set.
    private let control: UnsafeMutablePointer<UInt32>

    init() {
        control = .allocate(capacity: 1)
        control.initialize(to: 0)
    }

    deinit { control.deallocate() }

    /// Watches a registered page. `notice` runs once, on the watcher's thread, when the word changes or the watch
    /// gives up. False (nothing watched) if the page is not registered or `capacity` pages are watched already.
    public func watch(_ page: ExitNoticePage, notice: @escaping @Sendable (Notice) -> Void) -> Bool {
        guard page.isRegistered else { return false }
        let (added, start) = state.withLock { s -> (Bool, Bool) in
            guard s.watches.count < Self.capacity else { return (false, false) }
            s.watches[ObjectIdentifier(page)] = Watch(page: page, notice: notice)
            defer { s.running = true }
            return (true, !s.running)
        }
        guard added else { return false }
        if start { return startThread() }
        changed()
        return true
    }

    /// Ends a watch; its `notice` will not run after this returns (unless it is running now).
    public func unwatch(_ page: ExitNoticePage) {
        guard let removed = state.withLock({ $0.watches.removeValue(forKey: ObjectIdentifier(page)) }) else { return }
        if removed.stat >= 0 { close(removed.stat) }
        changed()
    }

    /// Pages watched now (for tests).
    public var watchedCount: Int { state.withLock { $0.watches.count } }

    private func changed() {
        _ = sdk_atomic_add_u32(control, 1)
        sdk_futex_wake_private(control)
    }

    /// Starts the thread; if it cannot be, nothing is watched (those workers' deaths are seen through their pidfds).
    private func startThread() -> Bool {
        if startDetachedThread(named: Self.threadName, { [self] in run() }) == 0 { return true }
        state.withLock { s in
            for watch in s.watches.values where watch.stat >= 0 { close(watch.stat) }
            s.watches = [:]
            s.running = false
        }
        return false
    }

    private func run() {
        var pages: [ExitNoticePage] = []
        var words: [UnsafeMutablePointer<UInt32>?] = []
        var expected: [UInt32] = []
        while true {
            let generation = sdk_atomic_load_u32(control)
            var unopened: [ExitNoticePage] = []
            pages = state.withLock { s in
                unopened = s.watches.values.filter { !$0.statOpened }.map { $0.page }
                return s.watches.values.map { $0.page }
            }
            for page in unopened { openStat(page) }
            if pages.isEmpty {
                if sdk_futex_wait_private(control, generation, Self.idleSeconds * 1000) != 0, errno == ETIMEDOUT {
                    let done = state.withLock { s -> Bool in
                        if s.watches.isEmpty { s.running = false }
                        return !s.running
                    }
                    if done { return }
                }
                continue
            }
            words.removeAll(keepingCapacity: true)
            expected.removeAll(keepingCapacity: true)
            var moved: [ExitNoticePage] = []
            for page in pages {
                if page.arm() {
                    words.append(page.word)
                    expected.append(page.armed)
                } else {
                    moved.append(page)
                }
            }
            if !moved.isEmpty {
                for page in moved { ended(page) }
                continue
            }
            let woken = words.withUnsafeBufferPointer { w in
                expected.withUnsafeBufferPointer { e in
                    sdk_futex_waitv(control, generation, w.baseAddress, e.baseAddress, Int32(w.count))
                }
            }
            // The word that woke the thread is read at once (a death is what the wait is for); the next turn sees
            // every other changed word (arm fails on it). A wake-up of a word that did not change is counted
            // against its worker.
            if woken >= 1, Int(woken) <= pages.count {
                let page = pages[Int(woken) - 1]
                if page.value != page.armed {
                    ended(page)
                } else {
                    let over = state.withLock { s -> Bool in
                        guard var watch = s.watches[ObjectIdentifier(page)] else { return false }
                        watch.spurious += 1
                        s.watches[ObjectIdentifier(page)] = watch
                        return watch.spurious >= Self.spuriousWakeLimit
                    }
                    if over { end(page, .tooManyWakeups) }
                }
            }
        }
    }

    /// Ends `page`'s watch (if `unwatch` has not) and tells its owner.
    private func end(_ page: ExitNoticePage, _ notice: Notice) {
        guard let watch = state.withLock({ $0.watches.removeValue(forKey: ObjectIdentifier(page)) }) else { return }
        watch.notice(notice)
        if watch.stat >= 0 { close(watch.stat) }
    }

    /// `page`'s word changed: ends its watch with what /proc says of its process.
    private func ended(_ page: ExitNoticePage) {
        guard let watch = state.withLock({ $0.watches.removeValue(forKey: ObjectIdentifier(page)) }) else { return }
        var code: Int32 = 0
        var result = watch.stat >= 0 ? sdk_exiting_status_fd(watch.stat, &code) : sdk_exiting_status(page.owner, &code)
        if result < 0, watch.stat >= 0 { result = sdk_exiting_status(page.owner, &code) }
        let error = errno
        switch result {
        case 1: watch.notice(.exiting(ExitStatus(waitStatus: code)))
        case 0: watch.notice(.notExiting)
        default:
            // Gone from /proc: a launcher's worker reaped before this thread ran says how it ended in the page.
            if page.ownID != page.owner, error == ENOENT || error == ESRCH, let status = page.launcherStatus {
                watch.notice(.exiting(status))
            } else {
                watch.notice(.unreadable(error))
            }
        }
        // After the notice: its owner is waiting for it, and a close of a /proc file costs ~10 µs here.
        if watch.stat >= 0 { close(watch.stat) }
    }

    /// Opens the /proc/<pid>/stat of a new watch (kept by the watch, closed when it ends).
    private func openStat(_ page: ExitNoticePage) {
        let fd = sdk_open_proc_stat(page.owner)
        let kept = state.withLock { s -> Bool in
            guard var watch = s.watches[ObjectIdentifier(page)], !watch.statOpened else { return false }
            watch.statOpened = true
            watch.stat = fd
            s.watches[ObjectIdentifier(page)] = watch
            return true
        }
        if !kept, fd >= 0 { close(fd) }
    }
}

