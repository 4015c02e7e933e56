// Worker lifecycle on the engine's loop: I/O, messages, death, retirement (spawning: HostEngine+Spawn; exit
// notices: HostEngine+ExitNotices; heartbeats: HostEngine+Heartbeat).
//
// A worker ends one way: its exit descriptor fires (or, if it could not be watched, a poll sees it exit), it is
// reaped (`waitid(P_PIDFD)`), the descriptor is unregistered whatever the reap returned, its last replies are
// read, and what was still in flight is interrupted. It is marked dead before its last replies are read, so a
// queued request can never be handed to it. Timers that refer to a worker hold it and are cancelled when it
// dies (`workerEnded`; the kill-again timer at its reap), so a dead worker and its buffers are released at once.
//
// No weak reference to the engine, a worker or a connection, anywhere: the first one gives its object a side
// table for life, and every retain and release of it after that takes the runtime's slow path (a tenth of the
// simulation's time went there). The engine is alive while its loop accepts tasks (`keepAliveUntilStopped`),
// so what the loop runs holds it unowned; a timer or a task that refers to a worker holds it strongly, for at
// most as long as the timer is armed, and checks its phase when it runs.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix

extension HostEngine {
    // MARK: I/O

    /// A worker's ping is answered only while less than this is queued for it, unread.
    static let maxPendingBytesForPong = 64 << 10

    func send(_ message: Message, to worker: WorkerProcess) {
        do {
            try worker.connection.send(message)
        } catch {
            // Only an over-limit frame can fail; the request cannot be sent, so it is interrupted.
            log(.error, "\(worker.extensionID): cannot send \(message.typeName): \(error)")
            if case .begin(let id, _, _, _) = message { beginNotSent(id, to: worker, error) }
        }
    }

    /// A begin that could not be queued (over the frame limit): the request is interrupted.
    func beginNotSent(_ id: RequestID, to worker: WorkerProcess, _ error: WireError) {
        worker.inFlight.remove(id)
        noLongerOwed(id)
        finish(id, .interrupted(.protocolViolation(error.requestNotSent)))
    }

    func handle(_ message: Message, from worker: WorkerProcess) {
        if !worker.lifecycle.welcomed {
            // Its `welcome` comes first (after its launcher's own frames; a ping of its own may come before): a
            // worker that answers anything, a ping included, without it has read `hello` and skipped the handshake,
            // and with it the version and identifier checks.
            switch message {
            case .welcome, .sandboxed, .launchFailed, .ping, .error, .unknown: break
            default:
                protocolViolation(worker, "worker sent '\(message.typeName)' before its 'welcome'")
                return
            }
        }
        switch message {
        case .welcome(let version, let identifier, _):
            guard version == protocolVersion else {
                // An extension built against another SDK: say which, rather than only that the welcome was odd.
                protocolViolation(worker, "the worker speaks protocol \(version); this host speaks \(protocolVersion) "
                    + "(rebuild the extension against this SDK)")
                return
            }
            guard identifier == worker.extensionID, worker.lifecycle.welcome() else {
                protocolViolation(worker, "unexpected welcome (version \(version), identifier \(identifier))")
                return
            }
            // Read after its death: recorded (no requeue), and nothing more to start.
            if worker.lifecycle.phase.isOver { return }
            settlePid(worker)
            // After this turn's writes (the requests queued for it go out first).
            loop.runBeforeSleeping { [unowned self, worker] in self.watchExitNotice(worker) }
            emit(.ready, worker)
            // Requests sent before the handshake kept their items in case it never came; it has.
            for id in worker.inFlight { requests[id]?.items = [] }
            let waiters = worker.readyWaiters
            worker.readyWaiters = []
            for waiter in waiters { waiter(.success(worker.pid)) }
            // A worker started with nothing to do (warm, or prewarmed) is retired when idle like any other.
            if worker.inFlight.isEmpty { requestSlotFreed(worker) }
        case .complete(let id, let items):
            completed(id, items, from: worker)
        case .partial(let id, let items):
            partialResult(id, items, from: worker)
        case .cancelled(let id, let error):
            guard settle(id, on: worker) else { return }
            if !finish(id, .cancelled(error)) {
                log(.debug, "\(worker.extensionID): cancellation of \(id) acknowledged")
            }
            requestSlotFreed(worker)
        case .pong(let seq):
            // Only the answer to the ping outstanding counts: a pong of the worker's own (any seq, at any time) sent
            // from another thread would keep a hung worker alive.
            guard worker.ping != nil, seq == worker.pingSeq else {
                log(.debug, "\(worker.extensionID) pid \(worker.pid): pong \(seq) answers no ping; ignored")
                return
            }
            worker.ping = nil
            worker.starvationCheck = nil
        case .ping(let seq):
            // Answered while the worker reads what it is sent: the pongs of one that pings and never reads would
            // pile up in its output buffer without bound.
            guard worker.connection.pendingOutputBytes <= Self.maxPendingBytesForPong else {
                log(.debug, "\(worker.extensionID) pid \(worker.pid): ping \(seq) not answered; its output is backed up")
                return
            }
            send(.pong(seq: seq), to: worker)
        case .error(let text, let id):
            logForWorker(worker, .warning, "\(worker.extensionID) pid \(worker.pid) reported an error\(id.map { " for \($0)" } ?? ""): "
                + OutputLines.escape(Array(text.utf8.prefix(OutputLines.maxLineBytes))))
        case .sandboxed(let layers, let skipped, let reportedPID, let timings):
            // The launcher's frame comes first, before the extension runs; the extension cannot send a second.
            guard worker.lifecycle.beforeWelcome, !worker.sandboxReported else {
                protocolViolation(worker, "worker sent 'sandboxed', which only its launcher sends, first")
                return
            }
            worker.sandboxReported = true
            let namespaced = layers.contains("pidNamespace")
            if let reportedPID, let direct = worker.adoptWorkerPID(reportedPID, signalDirectly: !namespaced) {
                log(.info, "\(worker.extensionID): worker pid \(reportedPID) (its launcher's child), "
                    + (worker.policy.sandbox == .none ? "unconfined (Sandbox none)" : "sandboxed"))
                // The launcher's worker is pid 2 of its namespace (pid 1 is the launcher's init): that is the id
                // its runtime stores in the exit-notice word. Without a pid namespace (the launcher only its
                // subreaping parent) it is the same pid inside and out.
                worker.exitNotice?.moved(to: reportedPID, seenInsideAs: namespaced ? 2 : reportedPID)
                if !namespaced && !direct && layers.contains("subreaper") {
                    log(.warning, "\(worker.extensionID) pid \(reportedPID): cannot hold a pidfd of it; a kill goes to its "
                        + "launcher, and what it started may outlive it")
                }
            }
            settlePid(worker)
            worker.sandboxLayers = layers
            worker.sandboxSkipped = skipped
            for entry in timings.prefix(64) {
                let parts = entry.split(separator: " ")
                if parts.count == 2, let us = Int(parts[1]) { worker.sandboxMicroseconds[String(parts[0].prefix(64))] = us }
            }
            for text in skipped {
                log(.warning, "\(worker.extensionID) pid \(worker.pid): sandbox: " + OutputLines.escape(Array(text.utf8.prefix(1024))))
            }
        case .launchFailed(let reason):
            // Before `sandboxed` (a layer failed) or just after it (the exec failed). Only counted as a launch
            // failure if the process then exits with the launcher's status, 125.
            guard worker.lifecycle.beforeWelcome, worker.launchFailure == nil else {
                protocolViolation(worker, "worker sent 'launchFailed', which only its launcher sends, first")
                return
            }
            worker.sandboxReported = true
            settlePid(worker)
            worker.launchFailure = String(decoding: Array(reason.utf8.prefix(1024)), as: UTF8.self)
        case .leak(let id, let alive, let afterMs):
            leakReported(id, alive: alive, afterMs: afterMs, by: worker)
        case .hostCall(let id, let call, let service, let items):
            hostCall(id, call, service, items, from: worker)
        case .hostCallCancel(let id, let call):
            hostCallCancelled(id, call, by: worker)
        case .unknown(let type):
            logForWorker(worker, .info, "\(worker.extensionID): unknown message type '\(OutputLines.escape(Array(type.utf8.prefix(64))))'; ignored")
        case .hello, .begin, .cancel, .credit, .connect, .connected, .assigned, .interrupted, .status, .statusReport, .prewarm,
            .prewarmed, .subscribe, .event, .hostCallResult, .hostCallError:
            protocolViolation(worker, "worker sent '\(message.typeName)', which is not a worker's to send")
        }
    }

    /// Marks `id` as no longer in flight on `worker`. A duplicate of a recent reply is dropped and logged;
    /// a reply to an id this worker never had is a protocol violation.
    /// `idRange`: where the payload's id is, when ForwardScan found it already (`forwardableCompletion` has then
    /// checked that the request forwards its completion, so it is not looked up again).
    private func completed(_ id: RequestID, _ items: [ExtensionItem], from worker: WorkerProcess,
                           idRange: Range<Int>? = nil)
    {
        guard settle(id, on: worker) else { return }
        let forwards = idRange != nil || (forwardsPayloads && requests[id]?.deliverForwarded != nil)
        let finished = forwards
            ? worker.connection.withForwardablePayload { payload in
                let forwarded = payload.flatMap { p in (idRange ?? ForwardedFrame.idRange(in: p)).map { (p, $0) } }
                return finish(id, .completed(items), forwarded: forwarded)
            }
            : finish(id, .completed(items))
        if !finished {
            logForWorker(worker, .info, "\(worker.extensionID): late completion of \(id) (already ended); dropped")
        }
        requestSlotFreed(worker)
    }

    /// A worker's `complete` that ForwardScan checked without decoding it (daemon). Taken only when it goes on to
    /// the client as it is: its request is in flight on this worker and forwards completions. Anything else
    /// (a late or unknown reply) is decoded and takes `handle`'s checks and logs.
    func forwardableCompletion(_ scanned: ScannedMessage, from worker: WorkerProcess) -> Bool {
        guard scanned.kind == .complete, worker.lifecycle.welcomed, worker.inFlight.contains(scanned.id),
            requests[scanned.id]?.deliverForwarded != nil, worker.connection.withForwardablePayload({ $0 != nil })
        else { return false }
        completed(scanned.id, [], from: worker, idRange: scanned.idRange)
        return true
    }

    func settle(_ id: RequestID, on worker: WorkerProcess) -> Bool {
        if worker.inFlight.remove(id) != nil {
            noLongerOwed(id)
            worker.recentlyFinished.insert(id)
            if !worker.streamOutstanding.isEmpty { worker.streamOutstanding[id] = nil }
            if !worker.cancelTimers.isEmpty, let timer = worker.cancelTimers.removeValue(forKey: id) { loop.cancelTimer(timer) }
            return true
        }
        if worker.recentlyFinished.contains(id) {
            logForWorker(worker, .warning, "\(worker.extensionID) pid \(worker.pid): second reply for \(id); dropped")
        } else {
            protocolViolation(worker, "reply for unknown request \(id)")
        }
        return false
    }

    func requestSlotFreed(_ worker: WorkerProcess) {
        recycleIfDrained(worker)
        drainWaiting(worker.poolKey)
        scheduleIdleRetirement(worker)
        retryWaitingForRoom()
    }

    func scheduleIdleRetirement(_ worker: WorkerProcess) {
        guard worker.inFlight.isEmpty, worker.lifecycle.phase.isRunning, worker.idleTimer == nil
        else { return }
        let idle = worker.idleTimeoutOverride ?? worker.policy.idleTimeoutSeconds
        worker.idleTimer = loop.schedule(afterNanoseconds: nanoseconds(idle)) {
            [unowned self, worker] in
            worker.idleTimer = nil
            if worker.inFlight.isEmpty, self.mayRetireIdle(worker) { self.retire(worker, grace: 2, because: "idle") }
        }
    }

    /// Reads at most `pipeReadsPerTurn` chunks of a worker's output per loop turn (the rest waits for the next
    /// turn: level-triggered), so a flood of output cannot starve anyone. Output becomes escaped, rate-limited
    /// log lines; stderr is also kept raw in the crash report's tail.
    func drainPipe(_ worker: WorkerProcess, stderr: Bool, maxReads: Int = 4) {
        let fd = stderr ? worker.stderrFD : worker.stdoutFD
        guard stderr ? worker.stderrOpen : worker.stdoutOpen else { return }
        // Made only for a line that is logged: most reads log nothing, and the label was ~0.5% of a simulation.
        func label() -> String { outputLabel(worker, stderr: stderr) }
        let logs = configuration.logLevel <= .info
        let emit: (String) -> Void = { [unowned self] line in self.log(.info, "\(label()): \(line)") }
        for _ in 0..<maxReads {
            let result = readBuffer.withUnsafeMutableBytes { raw in
                Result { () throws(SystemError) in try readNonBlocking(fd, into: raw) }
            }
            switch result {
            case .success(.bytes(let n)):
                let now = loop.now
                readBuffer.withUnsafeBytes { raw in
                    let chunk = UnsafeRawBufferPointer(rebasing: raw[0..<n])
                    if stderr { worker.stderrTail.append(chunk) }
                    guard logs else { return }
                    if stderr {
                        worker.stderrLines.append(chunk, now: now, emit: emit)
                    } else {
                        worker.stdoutLines.append(chunk, now: now, emit: emit)
                    }
                }
            case .success(.wouldBlock):
                reportDroppedOutput(worker, label: label(), stderr: stderr)
                return
            case .success(.endOfFile), .failure:
                if logs {
                    let now = loop.now
                    if stderr { worker.stderrLines.flush(now: now, emit: emit) } else { worker.stdoutLines.flush(now: now, emit: emit) }
                }
                reportDroppedOutput(worker, label: label(), stderr: stderr, atEnd: true)
                loop.unregister(fd)
                if stderr { worker.closeStderr() } else { worker.closeStdout() }
                return
            }
        }
    }

    private func reportDroppedOutput(_ worker: WorkerProcess, label: @autoclosure () -> String, stderr: Bool, atEnd: Bool = false) {
        let now = loop.now
        let dropped = stderr ? worker.stderrLines.takeDropped(now: now, force: atEnd) : worker.stdoutLines.takeDropped(now: now, force: atEnd)
        if dropped > 0 {
            log(.warning, "\(label()): \(dropped) line(s) dropped (more than \(Int(OutputLines.linesPerSecond)) a second)")
        } else if (stderr ? worker.stderrLines.uncounted : worker.stdoutLines.uncounted) > 0 {
            countDropsSoon(worker)
        }
    }

    /// What a worker's output lines are logged under.
    func outputLabel(_ worker: WorkerProcess, stderr: Bool) -> String {
        "\(worker.extensionID)[\(worker.pid)] \(stderr ? "stderr" : "stdout")"
    }

    /// Counts, a second from now, what `worker`'s budgets have dropped and not counted: a count is otherwise given
    /// only at a drop a second after the last one, and the last of a flood that stops (of messages, stdout or
    /// stderr) waited for the worker's next line or its end. One timer for the three; cancelled at its end, where
    /// each is counted in full (its pipes at their end of file, or where they are closed without one).
    func countDropsSoon(_ worker: WorkerProcess) {
        guard worker.dropCountTimer == nil, !worker.lifecycle.phase.isOver else { return }
        worker.dropCountTimer = loop.schedule(afterNanoseconds: 1_000_000_000) { [unowned self, worker] in
            worker.dropCountTimer = nil
            self.countDropped(worker)
        }
    }

    /// Logs what `worker`'s three budgets dropped and have not counted, now (a pipe already at its end of file has
    /// nothing left to count).
    func countDropped(_ worker: WorkerProcess) {
        reportDroppedMessageLines(worker, force: true)
        for stderr in [false, true] {
            reportDroppedOutput(worker, label: outputLabel(worker, stderr: stderr), stderr: stderr, atEnd: true)
        }
    }

    /// Logs a line that a worker's message caused, within the worker's budget (`LineBudget`): a worker that sends
    /// a million unknown messages or errors costs the log a few hundred lines and a count a second.
    func logForWorker(_ worker: WorkerProcess, _ level: LogLevel, _ message: @autoclosure () -> String) {
        let now = loop.now
        if worker.messageLines.allow(now: now) {
            log(level, message())
        } else if !reportDroppedMessageLines(worker, force: false) {
            // Counted within a second even if the flood stops here (a count given only at the next drop was
            // never given for the last of a flood: 1 reported of 797 dropped).
            countDropsSoon(worker)
        }
    }

    /// Logs how many lines `worker`'s messages had dropped since the last count, if a second has passed since it
    /// (or `force`); whether it did.
    @discardableResult
    func reportDroppedMessageLines(_ worker: WorkerProcess, force: Bool) -> Bool {
        let dropped = worker.messageLines.takeDropped(now: loop.now, force: force)
        guard dropped > 0 else { return false }
        log(.warning, "\(worker.extensionID) pid \(worker.pid): \(dropped) more line(s) about its messages dropped "
            + "(more than \(Int(OutputLines.linesPerSecond)) a second)")
        return true
    }

    // MARK: Failure and death

    func protocolViolation(_ worker: WorkerProcess, _ detail: String) {
        worker.connection.close()
        // Killed by the host already: half a frame at the end of its socket (or a reset) is what the kill left,
        // not a violation of its own; the kill's reason stands.
        if worker.lifecycle.kill != nil { return }
        if worker.lifecycle.phase.isOver {
            // Found in what it left on its socket, read after its exit: nothing to kill, but its requests end
            // for this rather than for its exit status (unless the host had killed it: that reason stands).
            guard worker.lifecycle.brokeProtocolAfterEnd(detail) else { return }
            noteViolation(worker, detail)
            return
        }
        noteViolation(worker, detail, killing: true)
        kill(worker, .protocolViolation(detail))
    }

    /// Logs and counts the protocol violation that is `worker`'s reason (each caller decides that, once).
    private func noteViolation(_ worker: WorkerProcess, _ detail: String, killing: Bool = false) {
        log(.error, "\(worker.extensionID) pid \(worker.pid) broke the protocol: \(detail)" + (killing ? "; killing it" : ""))
        count(worker.extensionID, \.protocolViolations)
    }

    /// A worker still alive when its exit timer fires: one that had left half a frame and lived on broke the
    /// protocol (whatever retired it since); any other is killed for `reason`.
    private func killLingering(_ worker: WorkerProcess, _ reason: InterruptionReason) {
        if let detail = worker.lifecycle.truncatedFrame {
            protocolViolation(worker, detail)
        } else {
            kill(worker, reason)
        }
    }

    func kill(_ worker: WorkerProcess, _ reason: InterruptionReason, forCancel: Bool = false) {
        if worker.kill(reason: reason, forCancel: forCancel), reason == .hang { count(worker.extensionID, \.hangKills) }
        killAgainUntilReaped(worker)
    }

    /// A worker the host killed, or whose exit notice ended it, that is not reaped 3 s later is sent SIGKILL
    /// again, and so every 3 s until it is. The second kill reaches a subreaping launcher too (`PidfdChild.signal`):
    /// the host's child, the one process it can reap, which a worker under `Sandbox none`, or what it left, may
    /// have stopped. Without it such a worker is never reaped.
    func killAgainUntilReaped(_ worker: WorkerProcess, again: Bool = false) {
        guard worker.awaitsReap, worker.killAgainTimer == nil else { return }
        worker.killAgainTimer = loop.schedule(afterNanoseconds: 3_000_000_000) { [unowned self, worker] in
            worker.killAgainTimer = nil
            guard worker.awaitsReap else { return }
            // Said once: a process stuck in the kernel may take many rounds.
            if !again { self.log(.warning, "\(worker.extensionID) pid \(worker.pid) is not reaped 3 s after its end; killing it again") }
            worker.finishOff()
            self.killAgainUntilReaped(worker, again: true)
        }
    }

    /// Its socket ended in the middle of a frame. Whether that broke the protocol waits for how the worker ends
    /// (`WorkerLifecycle.ending`): a process killed by a signal (a crash) cut its last frame short, and its requests
    /// end with the signal, or go to the next worker if it had not yet said welcome; one that exits, or lives on
    /// without its socket, sent a truncated frame. A worker the host killed already left what the kill cut short.
    func socketEndedMidFrame(_ worker: WorkerProcess, _ detail: String) {
        worker.connection.close()
        guard worker.lifecycle.endedMidFrame(detail) else { return }
        // Its idle timer would retire it meanwhile, and a kill at shutdown would be the reason, not the half frame.
        if let timer = worker.idleTimer {
            loop.cancelTimer(timer)
            worker.idleTimer = nil
        }
        socketBroken(worker)
    }

    /// The socket hit EOF or an error: the worker is exiting. Its exit status arrives through the exit
    /// descriptor; if it lingers without its socket, it is killed.
    func socketBroken(_ worker: WorkerProcess) {
        worker.connection.close()
        guard !worker.lifecycle.phase.isOver, worker.exitTimer == nil else { return }
        worker.exitTimer = loop.schedule(afterNanoseconds: 2_000_000_000) { [unowned self, worker] in
            guard !worker.lifecycle.phase.isOver else { return }
            worker.exitTimer = nil
            self.killLingering(worker, worker.lifecycle.retired ? .hostShutdown : .protocolViolation("closed its connection"))
        }
    }

    /// The exit descriptor is readable (or the poll fired): reap, unregister, read what is left, interrupt what
    /// was in flight, record a crash. A worker that ended on its exit notice is only reaped.
    func processExited(_ worker: WorkerProcess) {
        guard worker.awaitsReap else { return }
        let status: ExitStatus?
        do {
            guard let reaped = try worker.reap() else {
                if worker.exitWatched { log(.debug, "\(worker.extensionID) pid \(worker.pid): exit descriptor fired early") }
                return
            }
            status = reaped
        } catch {
            // The status is gone (the app ignores SIGCHLD, or something else reaped it): the process has exited
            // all the same. Never leave the descriptor registered, or the loop would spin on it.
            log(.warning, "\(worker.extensionID) pid \(worker.pid) exited; its status is unavailable (\(error))")
            status = nil
        }
        if worker.exitWatched {
            loop.unregister(worker.exitFD)
            worker.exitWatched = false
        }
        worker.closeChild()
        if let timer = worker.killAgainTimer {
            loop.cancelTimer(timer)
            worker.killAgainTimer = nil
        }
        // An early end has ended the watch already; `workerEnded` ends any other.
        let endedEarly = worker.lifecycle.phase == .exiting
        worker.lifecycle.reaped(status)
        if endedEarly {
            workers.reaped(worker)
            removeTemporaryDirectory(worker)
            log(.debug, "\(worker.extensionID) pid \(worker.pid) reaped (\(status.map(String.init(describing:)) ?? "status unavailable"))")
            stopIfIdle()
            return
        }
        workerEnded(worker, status: status)
    }

    /// The worker is gone (`dead`), or going (`exiting`): read what is left, interrupt what was in flight, record
    /// a crash, and start what its death makes room for.
    func workerEnded(_ worker: WorkerProcess, status: ExitStatus?) {
        unwatchExitNotice(worker)
        assert(worker.lifecycle.phase.isOver, "workerEnded of a worker that is \(worker.lifecycle.phase)")
        workers.remove(worker)
        for timer in [worker.idleTimer, worker.exitTimer, worker.reapPollTimer].compactMap({ $0 }) { loop.cancelTimer(timer) }
        for timer in worker.cancelTimers.values { loop.cancelTimer(timer) }
        worker.cancelTimers.removeAll()
        // Replies already written before the exit still count: a completed request is completed. Half a frame
        // left is a truncated frame, even when the exit notice came before the socket's end.
        worker.connection.drainLast()
        if let timer = worker.dropCountTimer { loop.cancelTimer(timer) }
        worker.dropCountTimer = nil

        let inFlight = Array(worker.inFlight).sorted { $0.uuidString < $1.uuidString }
        worker.inFlight.removeAll()
        for id in inFlight { noLongerOwed(id) }
        // At least a second: a manifest's IdleTimeoutSeconds may be 0.1 (with 64 warm workers, an extension that
        // exits at once would be restarted hundreds of times a second, every exit clean).
        let idle = max(nanoseconds(worker.idleTimeoutOverride ?? worker.policy.idleTimeoutSeconds), 1_000_000_000)
        let ending = worker.lifecycle.ending(
            status: status, hadRequests: !inFlight.isEmpty, livedPastIdleTimeout: loop.now &- worker.startedAt >= idle,
            launchFailure: worker.launchFailure, launcherFailureStatus: launcherFailureStatus, shuttingDown: shuttingDown)
        let reason = ending.reason, crashed = ending.crashed
        if let detail = worker.lifecycle.truncatedFrame, worker.lifecycle.kill == nil, reason == .protocolViolation(detail) {
            noteViolation(worker, detail)
        }
        if crashed { count(worker.extensionID, \.crashes) }
        let waiters = worker.readyWaiters
        worker.readyWaiters = []
        for waiter in waiters { waiter(.failure(.interrupted(reason))) }
        // Died before its handshake, on its own: no handler ran, so its requests wait for the next worker (at
        // most twice each; the restart limit ends a loop sooner).
        let requeue = ending.requeuesRequests
        // A death that quarantines the pool ends those requests as `quarantined`, like the ones waiting.
        if ending.diedOnItsOwn { workerDiedOnItsOwn(worker) }
        let quarantined = supervisor.isQuarantined(worker.poolKey, now: loop.now)
        // How many were still running and end now (a request past its deadline, or cancelled, has ended already
        // and only waited for its worker's answer: its crash report lists it, its outcome stands).
        var interrupted = 0
        for id in inFlight.reversed() {
            if requests[id] != nil { interrupted += 1 }
            if requeue && quarantined {
                finish(id, .interrupted(.quarantined))
            } else if requeue, let record = requests[id], record.requeues < 2 {
                record.requeues += 1
                record.worker = nil
                if !record.hostCalls.isEmpty { cancelHostCalls(record) }
                if record.publishesPid { pids.withLock { _ = $0.removeValue(forKey: id) } }
                requests.requeueFirst(record)
                interrupted -= 1
            } else {
                finish(id, .interrupted(reason))
            }
        }
        // The rest waits for no app: the outcomes above are on their way first. (Status and crash reports are
        // read on the loop, so nobody sees this turn half done.) The socket's close (an epoll_ctl and a close, ~25 µs
        // here) waits too; the report takes the output's tail.
        worker.connection.close()
        drainPipe(worker, stderr: true, maxReads: .max)
        drainPipe(worker, stderr: false, maxReads: .max)
        // Every budget counted in full: its messages, read to the end above, and its pipes, including one not at
        // its end of file (a crash seen through its exit notice, before the kernel closed its files; a child that
        // kept it), which is closed here: what it dropped is counted now, or never.
        countDropped(worker)
        if worker.stderrOpen {
            loop.unregister(worker.stderrFD)
            worker.closeStderr()
        }
        if worker.stdoutOpen {
            loop.unregister(worker.stdoutFD)
            worker.closeStdout()
        }
        let statusText = status.map(String.init(describing:)) ?? "status unavailable"
        if crashed {
            recordCrash(worker, reason: reason, inFlight: inFlight, interrupted: interrupted)
        } else {
            log(.info, "\(worker.extensionID): worker pid \(worker.pid) exited (\(statusText))")
        }
        settlePid(worker)
        // The reason says how it died; the status is detail only when it adds something (a kill for a deadline
        // says "timed out", its status "signal 9").
        let detail = crashed && reason.description == statusText ? nil : statusText
        emit(.exited, worker, reason: crashed ? reason : nil, detail: detail)
        // After the requests' outcomes are on their way: removing a folder is an opendir, a read and an rmdir
        // (~0.1 ms on this VM's ext4), and the app waits for none of it. A worker still exiting keeps it until
        // it is reaped.
        if worker.lifecycle.phase == .dead { removeTemporaryDirectory(worker) }
        drainWaiting(worker.poolKey)
        retryWaitingForRoom()
        if let manifest = manifests[worker.extensionID], worker.poolKey == worker.extensionID {
            topUpWarmWorkers(manifest)
        }
        if !workers.hasWorkers(in: worker.poolKey) { prunePools() }
        stopIfIdle()
    }

    func removeTemporaryDirectory(_ worker: WorkerProcess) {
        guard let folder = worker.temporaryDirectory else { return }
        worker.temporaryDirectory = nil
        if !workerFolders.remove(folder) { log(.warning, "\(worker.extensionID): cannot remove the worker's temp folder \(folder)") }
    }

    /// `interrupted`: how many of `inFlight` this ended (the others went back to the queue, or had ended and
    /// waited for the worker's answer).
    func recordCrash(_ worker: WorkerProcess, reason: InterruptionReason, inFlight: [RequestID], interrupted: Int) {
        let now = timespec.now
        var report = CrashReport(
            extensionIdentifier: worker.extensionID, pid: worker.pid, reason: reason,
            time: now.seconds, inFlightRequests: inFlight,
            stderrTail: worker.stderrTail.text)
        report.app = worker.app
        let others = inFlight.count - interrupted
        log(.warning, "\(worker.extensionID): worker pid \(worker.pid) ended: \(reason); \(interrupted) request(s) interrupted"
            + (others > 0 ? " (\(others) more on it had ended already or went back to the queue)" : ""))
        metrics.addCrashReport(report, limit: configuration.crashReportLimit)
        crashStore?.save(report)
    }

    /// Retires a worker: closing its socket tells it to exit (the runtime flushes its output and exits on EOF);
    /// it is killed if it has not exited after `grace` seconds.
    func retire(_ worker: WorkerProcess, grace: Double, because cause: String) {
        guard worker.lifecycle.retire(cause) else { return }
        if let timer = worker.idleTimer {
            loop.cancelTimer(timer)
            worker.idleTimer = nil
        }
        worker.connection.close()
        if let timer = worker.exitTimer { loop.cancelTimer(timer) }
        worker.exitTimer = loop.schedule(afterNanoseconds: nanoseconds(grace)) { [unowned self, worker] in
            guard !worker.lifecycle.phase.isOver else { return }
            worker.exitTimer = nil
            self.killLingering(worker, .hostShutdown)
        }
    }
}

extension timespec {
    static var now: timespec {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return ts
    }

    /// Seconds since the epoch, with the fraction.
    var seconds: Double { Double(tv_sec) + Double(tv_nsec) / 1e9 }
}
