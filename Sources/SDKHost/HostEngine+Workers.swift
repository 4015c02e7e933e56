// Worker lifecycle on the engine's loop: spawn, I/O, messages, death, idle retirement, heartbeats.

#if canImport(Glibc)
import Glibc
#endif
import SDKPosix

extension HostEngine {
    // MARK: Spawn

    func spawnWorker(_ manifest: ExtensionManifest) throws(HostError) -> WorkerProcess {
        guard let path = manifest.executablePath else {
            throw HostError(.executableNotFound, "\(manifest.identifier): executable '\(manifest.executableName)' "
                + "not found in \(manifest.searchedPaths.joined(separator: ", "))")
        }
        var environment = [
            "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
            // A crashing worker should die at once; the Swift backtracer would hold the crash for ~1 s.
            "SWIFT_BACKTRACE=enable=no",
            "SDKHOST_IPC_FD=3", "SDKHOST_HOST_PID=\(getpid())", "SDKHOST_EXTENSION_ID=\(manifest.identifier)",
            "SDKHOST_IDLE_TIMEOUT_MS=\(Int64(manifest.policy.idleTimeout * 1000))",
        ]
        if let mb = manifest.policy.memoryLimitMB { environment.append("SDKHOST_MEMORY_LIMIT_MB=\(mb)") }
        environment += configuration.workerEnvironment
        let request = SpawnRequest(path: path, arguments: [path], environment: environment)

        let channels: WorkerChannels
        do {
            channels = try spawnWithChannels(request)
        } catch {
            throw HostError(.system, "\(manifest.identifier): \(error)")
        }
        let worker = WorkerProcess(
            extensionID: manifest.identifier, policy: manifest.policy, process: channels.process,
            socket: channels.socket, stdout: channels.stdout, stderr: channels.stderr,
            loop: loop, wireLimits: configuration.wireLimits)
        count(manifest.identifier, \.spawns)
        workers[manifest.identifier, default: []].append(worker)
        do throws(SystemError) {
            try worker.connection.start(
                onMessage: { [unowned self] message in self.handle(message, from: worker) },
                onEnd: { [unowned self] end in
                    if case .badInput(let detail) = end {
                        self.protocolViolation(worker, detail)
                    } else {
                        self.socketBroken(worker)
                    }
                })
            try loop.register(worker.stdoutFD, events: EventLoop.readable) { [unowned self] _ in
                self.drainPipe(worker, stderr: false)
            }
            try loop.register(worker.stderrFD, events: EventLoop.readable) { [unowned self] _ in
                self.drainPipe(worker, stderr: true)
            }
            try loop.register(worker.pidfdRaw, events: EventLoop.readable) { [unowned self] _ in
                self.processExited(worker)
            }
        } catch {
            // Cannot supervise it: kill it; the pidfd may not be registered, so reap here.
            worker.kill(reason: .launchFailed("epoll: \(error)"))
            log(.error, "\(manifest.identifier): cannot watch worker \(worker.pid): \(error)")
        }
        log(.info, "\(manifest.identifier): started worker pid \(worker.pid)")
        send(.hello(version: protocolVersion, identifier: manifest.identifier, hostPid: getpid(),
                    idleTimeoutMs: Int64(manifest.policy.idleTimeout * 1000)), to: worker)
        if heartbeatTimer == nil { scheduleHeartbeat() }
        return worker
    }

    // MARK: I/O

    func send(_ message: Message, to worker: WorkerProcess) {
        do {
            try worker.connection.send(message)
        } catch {
            // Only an over-limit frame can fail; the request cannot be sent, so it is interrupted.
            log(.error, "\(worker.extensionID): cannot send \(message): \(error)")
            if case .begin(let id, _, _, _) = message {
                worker.inFlight.remove(id)
                finish(id, .interrupted(.protocolViolation("request too large to send: \(error.detail)")))
            }
        }
    }

    func handle(_ message: Message, from worker: WorkerProcess) {
        switch message {
        case .welcome(let version, let identifier, _):
            guard version == protocolVersion, identifier == worker.extensionID, worker.state == .starting else {
                protocolViolation(worker, "unexpected welcome (version \(version), identifier \(identifier))")
                return
            }
            worker.state = .ready
        case .complete(let id, let items):
            guard settle(id, on: worker) else { return }
            if !finish(id, .completed(items)) {
                log(.info, "\(worker.extensionID): late completion of \(id) (already ended); dropped")
            }
            requestSlotFreed(worker)
        case .cancelled(let id, let error):
            guard settle(id, on: worker) else { return }
            if !finish(id, .cancelled(error)) {
                log(.debug, "\(worker.extensionID): cancellation of \(id) acknowledged")
            }
            requestSlotFreed(worker)
        case .pong:
            worker.pingSentAt = nil
        case .ping(let seq):
            send(.pong(seq: seq), to: worker)
        case .error(let text, let id):
            log(.warning, "\(worker.extensionID) pid \(worker.pid) reported an error\(id.map { " for \($0)" } ?? ""): \(text)")
        case .unknown(let type):
            log(.info, "\(worker.extensionID): unknown message type '\(type)'; ignored")
        case .hello, .begin, .cancel, .connect, .connected, .assigned, .interrupted, .status, .statusReport:
            protocolViolation(worker, "worker sent a message that is not a worker's to send")
        }
    }

    /// Marks `id` as no longer in flight on `worker`. A duplicate of a recent reply is dropped and logged;
    /// a reply to an id this worker never had is a protocol violation.
    func settle(_ id: RequestID, on worker: WorkerProcess) -> Bool {
        if worker.inFlight.remove(id) != nil {
            worker.recentlyFinished.insert(id)
            return true
        }
        if worker.recentlyFinished.contains(id) {
            log(.warning, "\(worker.extensionID) pid \(worker.pid): second reply for \(id); dropped")
        } else {
            protocolViolation(worker, "reply for unknown request \(id)")
        }
        return false
    }

    func requestSlotFreed(_ worker: WorkerProcess) {
        drainWaiting(worker.extensionID)
        if worker.inFlight.isEmpty, worker.state == .ready || worker.state == .starting, worker.idleTimer == nil {
            worker.idleTimer = loop.schedule(afterNanoseconds: nanoseconds(worker.policy.idleTimeout)) { [unowned self] in
                worker.idleTimer = nil
                if worker.inFlight.isEmpty { self.retire(worker) }
            }
        }
    }

    func drainPipe(_ worker: WorkerProcess, stderr: Bool) {
        let fd = stderr ? worker.stderrFD : worker.stdoutFD
        guard stderr ? worker.stderrOpen : worker.stdoutOpen else { return }
        while true {
            let result = readBuffer.withUnsafeMutableBytes { raw in
                Result { () throws(SystemError) in try readNonBlocking(fd, into: raw) }
            }
            switch result {
            case .success(.bytes(let n)):
                readBuffer.withUnsafeBytes { raw in
                    let chunk = UnsafeRawBufferPointer(rebasing: raw[0..<n])
                    if stderr { worker.stderrTail.append(chunk) }
                    // An extension's output is never dropped: it goes to the host log (and stderr also to the
                    // crash report's tail).
                    if configuration.logLevel <= .info {
                        log(.info, "\(worker.extensionID)[\(worker.pid)] \(stderr ? "stderr" : "stdout"): "
                            + String(decoding: chunk, as: UTF8.self))
                    }
                }
            case .success(.wouldBlock):
                return
            case .success(.endOfFile), .failure:
                loop.unregister(fd)
                if stderr { worker.closeStderr() } else { worker.closeStdout() }
                return
            }
        }
    }

    // MARK: Failure and death

    func protocolViolation(_ worker: WorkerProcess, _ detail: String) {
        log(.error, "\(worker.extensionID) pid \(worker.pid) broke the protocol: \(detail); killing it")
        count(worker.extensionID, \.protocolViolations)
        unregisterSocket(worker)
        kill(worker, .protocolViolation(detail))
    }

    func kill(_ worker: WorkerProcess, _ reason: InterruptionReason) {
        if worker.killReason == nil, reason == .hang { count(worker.extensionID, \.hangs) }
        worker.kill(reason: reason)
    }

    /// The socket hit EOF or an error: the worker is exiting. Its exit status arrives through the pidfd; if it
    /// lingers without its socket, it is killed.
    func socketBroken(_ worker: WorkerProcess) {
        unregisterSocket(worker)
        guard worker.state != .dead else { return }
        loop.schedule(afterNanoseconds: 2_000_000_000) { [unowned self] in
            if worker.state != .dead {
                self.kill(worker, worker.state == .retiring ? .hostShutdown : .protocolViolation("closed its connection"))
            }
        }
    }

    func unregisterSocket(_ worker: WorkerProcess) {
        worker.connection.close()
    }

    /// The pidfd is readable: reap, read what is left, interrupt what was in flight, record a crash.
    func processExited(_ worker: WorkerProcess) {
        guard let status = worker.reap() else { return }
        loop.unregister(worker.pidfdRaw)
        // Replies already written before the exit still count: a completed request is completed.
        worker.connection.drain()
        unregisterSocket(worker)
        drainPipe(worker, stderr: true)
        drainPipe(worker, stderr: false)
        if worker.stderrOpen {
            loop.unregister(worker.stderrFD)
            worker.closeStderr()
        }
        if worker.stdoutOpen {
            loop.unregister(worker.stdoutFD)
            worker.closeStdout()
        }
        for timer in [worker.idleTimer, worker.retireKillTimer].compactMap({ $0 }) { loop.cancelTimer(timer) }
        let wasRetiring = worker.state == .retiring
        worker.state = .dead
        workers[worker.extensionID]?.removeAll { $0 === worker }

        let reason: InterruptionReason
        if let killReason = worker.killReason {
            reason = killReason
        } else {
            switch status {
            case .signaled(let sig): reason = .signal(sig)
            case .exited(let code): reason = .exited(code)
            }
        }
        let inFlight = Array(worker.inFlight)
        worker.inFlight.removeAll()
        let clean = status == .exited(0) && inFlight.isEmpty && worker.killReason == nil
        if !(clean || (wasRetiring && (worker.killReason == nil || worker.killReason == .hostShutdown))) {
            count(worker.extensionID, \.crashes)
            recordCrash(worker, reason: reason, inFlight: inFlight)
        } else {
            log(.info, "\(worker.extensionID): worker pid \(worker.pid) exited (\(status))")
        }
        for id in inFlight { finish(id, .interrupted(reason)) }
        drainWaiting(worker.extensionID)
        stopIfIdle()
    }

    func recordCrash(_ worker: WorkerProcess, reason: InterruptionReason, inFlight: [RequestID]) {
        let now = timespec.now
        let report = CrashReport(
            extensionIdentifier: worker.extensionID, pid: worker.pid, reason: reason,
            time: Double(now.tv_sec) + Double(now.tv_nsec) / 1e9, inFlightRequests: inFlight,
            stderrTail: worker.stderrTail.text)
        log(.warning, "\(worker.extensionID): worker pid \(worker.pid) ended: \(reason); "
            + "\(inFlight.count) request(s) interrupted")
        crashReports.append(report)
        crashStore?.save(report)
        if crashReports.count > configuration.crashReportLimit {
            crashReports.removeFirst(crashReports.count - configuration.crashReportLimit)
        }
    }

    /// Retires an idle worker: closing its socket tells it to exit; it is killed if it does not.
    func retire(_ worker: WorkerProcess) {
        guard worker.state == .ready || worker.state == .starting else { return }
        worker.state = .retiring
        unregisterSocket(worker)
        worker.retireKillTimer = loop.schedule(afterNanoseconds: 2_000_000_000) { [unowned self] in
            if worker.state != .dead { self.kill(worker, .hostShutdown) }
        }
    }

    // MARK: Heartbeat

    func scheduleHeartbeat() {
        heartbeatTimer = loop.schedule(afterNanoseconds: nanoseconds(configuration.heartbeatInterval)) { [unowned self] in
            self.heartbeatTimer = nil
            self.heartbeat()
        }
    }

    /// Pings every live worker; one whose previous ping is unanswered past the timeout is killed as hung.
    func heartbeat() {
        let now = monotonicNanoseconds()
        var any = false
        for worker in workers.values.joined() where worker.connection.isOpen && worker.killReason == nil {
            any = true
            if let sent = worker.pingSentAt {
                if now - sent > nanoseconds(configuration.heartbeatTimeout) {
                    log(.warning, "\(worker.extensionID) pid \(worker.pid) missed heartbeats for "
                        + "\(configuration.heartbeatTimeout) s; killing it")
                    kill(worker, .hang)
                }
            } else {
                worker.pingSeq += 1
                worker.pingSentAt = now
                send(.ping(seq: worker.pingSeq), to: worker)
            }
        }
        if any && !shuttingDown { scheduleHeartbeat() }
    }
}

extension timespec {
    static var now: timespec {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return ts
    }
}
