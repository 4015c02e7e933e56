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

    /// Pings every live worker; one whose previous ping is unanswered past the timeout is killed as hung.
    func heartbeat() {
        prunePools()
        let now = loop.now
        var any = false
        for worker in workers.all where worker.connection.isOpen && worker.lifecycle.kill == nil {
            any = true
            checkResidentMemory(worker)
            if let sent = worker.pingSentAt {
                if now &- sent > nanoseconds(configuration.heartbeatTimeoutSeconds), !starvedNotHung(worker, now: now, silent: now &- sent) {
                    // What was waiting unread on its socket tells a silent worker (0) from a loop that came late to
                    // its answer; its threads' states and CPU times tell a hung one from one the machine did not run.
                    var unread: Int32 = 0
                    let asked = ioctl(worker.connection.fd, UInt(FIONREAD), &unread) == 0
                    log(.warning, "\(worker.extensionID) pid \(worker.pid) missed heartbeats for "
                        + "\(tenths(now &- sent)) s; killing it"
                        + (asked ? " (\(unread) byte(s) unread on its socket; \(threadStates(worker.pid)))" : ""))
                    kill(worker, .hang)
                }
            } else {
                // Not guessable: a pong counts only with it, so a worker must read its socket to answer (each seq
                // from the system's generator: a seeded one's outputs give away the ones after them). Negative, so
                // every ping is the same size on the wire.
                worker.pingSeq = Int64(bitPattern: UInt64.random(in: 0...UInt64.max) | 1 << 63)
                worker.pingSentAt = now
                send(.ping(seq: worker.pingSeq), to: worker)
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

/// Nanoseconds as seconds with one decimal ("5.0").
func tenths(_ nanoseconds: UInt64) -> String {
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
