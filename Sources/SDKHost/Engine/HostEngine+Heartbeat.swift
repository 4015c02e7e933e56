// Heartbeats on the engine's loop: every live worker pinged each HeartbeatIntervalSeconds; one whose ping is
// unanswered past HeartbeatTimeoutSeconds killed as hung, unless the machine is not running it (starvation); and
// what a hung worker's threads were doing, for the log. The pong that answers a ping is read in `handle`
// (HostEngine+Workers).

#if canImport(Glibc)
import Glibc
#endif
import SDKPosix
import SDKWire

extension HostEngine {
    func scheduleHeartbeat() {
        heartbeatTimer = loop.schedule(afterNanoseconds: nanoseconds(configuration.heartbeatIntervalSeconds)) { [unowned self] in
            self.heartbeatTimer = nil
            self.heartbeat()
        }
    }

    /// Pings every live worker; one whose ping is unanswered past the timeout is killed as hung. The timeout counts
    /// only the time the worker's silence is its own (`AnswerClock`).
    func heartbeat() {
        prunePools()
        let now = loop.now
        let timeout = nanoseconds(configuration.heartbeatTimeoutSeconds)
        var any = false
        for worker in workers.all where worker.connection.isOpen && worker.lifecycle.kill == nil {
            any = true
            checkResidentMemory(worker)
            // Recycled for its memory (a drained worker retires at once): its socket is closed, and its descriptor
            // number may be another's by now.
            guard worker.connection.isOpen, worker.lifecycle.kill == nil else { continue }
            if var ping = worker.ping {
                ping.look(at: now, connection: worker.connection)
                worker.ping = ping
                let silent = now &- ping.sentAt
                // Past the starvation limit from its sending, the host's being behind no longer excuses it.
                let overdue = ping.charged > timeout || silent > starvationLimit(timeout)
                if overdue, !starvedNotHung(worker, now: now, silent: silent) {
                    // What was waiting unread on its socket tells a silent worker (0) from a loop that came late to
                    // its answer; its threads' states and CPU times tell a hung one from one the machine did not run.
                    let unread = unreadInputBytes(worker.connection.fd)
                    log(.warning, "\(worker.extensionID) pid \(worker.pid) missed heartbeats for "
                        + "\(tenths(ping.charged)) s (\(tenths(silent)) s since the ping); killing it"
                        + (unread >= 0 ? " (\(unread) byte(s) unread on its socket, "
                            + "\(worker.connection.pendingOutputBytes) queued for it; \(threadStates(worker.pid)))" : ""))
                    kill(worker, .hang)
                }
            } else {
                // Not guessable: a pong counts only with it, so a worker must read its socket to answer (each seq
                // from the system's generator: a seeded one's outputs give away the ones after them; through the
                // shim's per-thread pool, one getrandom call per 16 pings rather than one each). Negative, so
                // every ping is the same size on the wire.
                let seq = Int64(bitPattern: randomWords().0 | 1 << 63)
                send(.ping(seq: seq), to: worker)
                worker.pingSeq = seq
                worker.ping = AnswerClock(sentAt: now, connection: worker.connection)
            }
        }
        if any && !shuttingDown { scheduleHeartbeat() }
    }

    /// Whether a worker past its heartbeat timeout is runnable but has had almost no CPU since: the machine (or
    /// its scheduler) is not running it, so its silence says nothing about the worker. Such a worker is waited for
    /// up to `starvationLimit`; one that gets a tenth of a CPU or more in that time and still does not answer is
    /// hung (a busy loop) and is killed at the next tick, and one asleep, stopped, stuck in the kernel or at a
    /// priority it lowered itself at once. A loaded suite showed why: a new worker, runnable, waited 9.3 s for a
    /// CPU and ran 22 ms while two busy processes ran.
    func starvedNotHung(_ worker: WorkerProcess, now: UInt64, silent: UInt64) -> Bool {
        guard silent <= starvationLimit(nanoseconds(configuration.heartbeatTimeoutSeconds)),
            let look = starvation(of: worker, since: worker.starvationCheck, now: now)
        else { return false }
        if worker.starvationCheck == nil {
            log(.warning, "\(worker.extensionID) pid \(worker.pid) missed heartbeats for \(tenths(silent)) s "
                + "but is runnable (\(look.times.ranNanoseconds / 1_000_000) ms on a CPU and "
                + "\(look.times.waitedNanoseconds / 1_000_000) ms waiting for one so far): waiting to see whether it gets one")
        }
        worker.starvationCheck = look.check
        return look.starved
    }

    /// How long a starved worker is waited for, from its ping or its cancel: four timeouts (or grace periods), and
    /// at least 30 s. Under two CPU hogs this kernel starved a worker for about ten seconds at a time; killing it
    /// sooner only spawns a replacement that waits as long. A worker cannot make itself look starved (it must be
    /// runnable, at normal priority, and get under a tenth of a CPU), so a long limit only bounds a machine's
    /// overload, not a worker's.
    func starvationLimit(_ timeout: UInt64) -> UInt64 { max(4 * timeout, 30_000_000_000) }

    /// Whether the machine is running `worker`, judged since `check`: nil if it is not runnable, runs at a priority
    /// it lowered itself, or cannot be read, and its silence is its own; else the check to judge from next time
    /// (`check`, or, at the first look, a new one, which gives it the benefit of the doubt), and whether it has had
    /// under a tenth of a CPU since.
    func starvation(of worker: WorkerProcess, since check: StarvationCheck?, now: UInt64)
        -> (check: StarvationCheck, starved: Bool, times: SchedulerTimes)?
    {
        guard let times = worker.schedulerTimes(), times.runnable, !times.lowPriority else { return nil }
        guard let check, check.pid == worker.pid, times.ranNanoseconds >= check.ran else {
            return (StarvationCheck(at: now, pid: worker.pid, ran: times.ranNanoseconds), true, times)
        }
        return (check, (times.ranNanoseconds - check.ran) &* 10 < now &- check.at, times)
    }
}

/// An answer the host waits for from a worker (a pong, a cancel's acknowledgement), and how much of the time since
/// it asked counts against the worker: the time the host was not behind it, judged at each look for the interval
/// since the last. The host is behind while its question waits in its own output and the worker is reading what
/// comes before it (or the kernel holds nothing for the worker to read: the host has not written yet), and while
/// what the worker wrote waits unread on the host's side, not paused (the answer may be in it, or behind it: the
/// worker blocked writing to a host that has not read it). A daemon busy with clients that never read (twenty of
/// them sending 1 MiB echoes) killed well-behaved Echo workers as hung: each was blocked writing its reply to the
/// daemon. A worker that reads nothing, or whose output the host has read, is charged as before; one that keeps
/// the host behind without answering is killed at the starvation limit (`HostEngine.starvationLimit`).
struct AnswerClock {
    /// When the question was queued.
    let sentAt: UInt64
    /// Where the question ends in what was queued to the worker over the connection's life.
    let end: Int
    /// The time counted against the worker so far.
    private(set) var charged: UInt64 = 0
    /// When it was last looked at, and how many bytes the kernel had taken for the worker then.
    private var lookedAt: UInt64
    private var writtenThen: Int

    /// For the frame just queued on `connection`.
    init(sentAt: UInt64, connection: FramedConnection) {
        self.sentAt = sentAt
        end = connection.bytesQueued
        lookedAt = sentAt
        writtenThen = connection.bytesWritten
    }

    /// Counts the time since the last look against the worker unless the host was behind it.
    mutating func look(at now: UInt64, connection: FramedConnection) {
        defer { lookedAt = now }
        // Closed (the worker lost its socket, or it ended): nothing waits on either side, and its descriptor
        // number may be another's by now.
        guard connection.isOpen else {
            charged &+= now &- lookedAt
            return
        }
        let written = connection.bytesWritten
        let questionWaitsHere = written < end
        // The kernel took more for the worker (so it read), or holds nothing for it to read.
        let workerWaitsForUs = written > writtenThen || unreadOutputBytes(connection.fd) == 0
        let hostBehind = (questionWaitsHere && workerWaitsForUs)
            || (!connection.isReadingPaused && unreadInputBytes(connection.fd) > 0)
        if !hostBehind { charged &+= now &- lookedAt }
        writtenThen = written
    }
}

/// Nanoseconds as seconds with one decimal ("5.0").
package func tenths(_ nanoseconds: UInt64) -> String {
    let t = (nanoseconds &+ 50_000_000) / 100_000_000
    return "\(t / 10).\(t % 10)"
}

/// Each thread of `pid` as its name, state letter and where the kernel has it wait ("S futex_wait_queue", "R 0",
/// "D folio_wait_bit_common"), with the time it has run on a CPU and waited for one (schedstat), at most 8:
/// whether a silent worker was runnable but not run, running, asleep in a call, or stuck in the kernel. Read
/// once, when a worker is killed as hung.
func threadStates(_ pid: pid_t) -> String {
    guard let tids = listDirectory("/proc/\(pid)/task") else { return "threads unknown" }
    func text(_ path: String) -> String { (try? readFile(path)).map { String(decoding: $0, as: UTF8.self) } ?? "?" }
    let states = tids.sorted { (Int($0) ?? 0) < (Int($1) ?? 0) }.prefix(8).map { tid -> String in
        let thread = ThreadSchedule(pid: pid, tid: tid)
        let wchan = text("/proc/\(pid)/task/\(tid)/wchan")
        let comm = text("/proc/\(pid)/task/\(tid)/comm")
        let cpu = thread.ran.flatMap { ran in thread.waited.map { " ran \(ran / 1_000_000) ms, waited \($0 / 1_000_000) ms" } } ?? ""
        return "\(comm.filter { !$0.isNewline }) \(thread.state) \(wchan.isEmpty ? "0" : wchan)\(cpu)"
    }
    // How the scheduler treats it: its main thread's policy and nice (stat, as read above), its autogroup (one per
    // session), the CPUs it may use.
    let main = ThreadSchedule(pid: pid, tid: "\(pid)")
    let cpus = text("/proc/\(pid)/status").split(separator: "\n").first { $0.hasPrefix("Cpus_allowed_list:") }
        .map { String($0.dropFirst("Cpus_allowed_list:".count).drop { $0 == " " || $0 == "\t" }) } ?? "?"
    let placement = "policy \(main.policy.map(String.init) ?? "?"), nice \(main.nice.map(String.init) ?? "?"), "
        + "\(text("/proc/\(pid)/autogroup").filter { !$0.isNewline }), CPUs \(cpus)"
    return "threads: " + states.joined(separator: ", ") + (tids.count > 8 ? " and \(tids.count - 8) more" : "") + "; " + placement
}
