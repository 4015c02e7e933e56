// Host calls on the engine's loop: a worker asks the app's service for something on behalf of a request it runs
// (HostServices.swift; the wire: Messages.swift, "Host services"). A call is checked here, and only a call that
// passes reaches the app: it must come after the worker's handshake, belong to a request this worker runs, use a
// new number, stay within the MaxHostCallsInFlight the worker was started with, and name a service its manifest
// listed (else it ends at once with an error to the worker). Its answer comes back through the loop and goes to
// the worker only if the call is still the request's: a request that ends (`finish`, however it ends) or goes
// back to the queue cancels its calls still running and forgets them, so a late answer finds nothing and is
// dropped.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix
import Synchronization

extension HostEngine {
    func hostCall(_ id: RequestID, _ call: Int64, _ service: String, _ items: [ExtensionItem], from worker: WorkerProcess) {
        let named = "service '\(OutputLines.escape(Array(service.utf8.prefix(128))))'"
        // Not before its handshake: `handle(_:from:)` refuses any call before the worker's welcome.
        guard worker.inFlight.contains(id) else {
            // The worker finished the request while one of its threads was starting a call: the runtime ends
            // such a call itself, and the frames crossed. Any other id is a request it was never given.
            if worker.recentlyFinished.contains(id) {
                answerHostCall(.hostCallError(id: id, call: call, error: .hostCallRequestEnded), to: worker)
            } else {
                protocolViolation(worker, "worker called \(named) for a request it is not running")
            }
            return
        }
        guard let record = requests[id], record.worker === worker else {
            // Cancelled or timed out here, and the worker has not read its cancel yet: a race, not a fault.
            answerHostCall(.hostCallError(id: id, call: call, error: .hostCallRequestEnded), to: worker)
            return
        }
        guard call > 0 else {
            protocolViolation(worker, "worker numbered a host call \(call) in request \(id): a call's number is positive")
            return
        }
        guard record.hostCalls[call] == nil else {
            protocolViolation(worker, "worker reused host call number \(call) of request \(id)")
            return
        }
        // The policy the worker was started with, and told (SDKHOST_MAX_HOST_CALLS): a rescan since changes the
        // next workers, not this one.
        let limit = worker.policy.maxHostCallsInFlight
        guard record.hostCalls.count < limit else {
            protocolViolation(worker, "worker made more than \(limit) host calls of request \(id) at once (MaxHostCallsInFlight)")
            return
        }
        guard worker.policy.hostServices.contains(service) else {
            logForWorker(worker, .info, "\(worker.extensionID): call to \(named), which its HostServices does not list; refused")
            answerHostCall(.hostCallError(id: id, call: call, error: .serviceNotAllowed(service)), to: worker)
            return
        }
        guard let services = record.services else {
            answerHostCall(.hostCallError(id: id, call: call, error: .serviceNotProvided(service)), to: worker)
            return
        }
        // Held until the answer is sent or the request ends. An answer made on this thread (a service the app
        // does not provide; the daemon's client that has gone) is handled at once, here: it may come before
        // `start` returns, so the call is recorded first.
        record.hostCalls[call] = {}
        let gate = HostCallGate(loop: loop) { [unowned self] result in self.hostCallAnswered(id, call, result) }
        let cancel = services.start(HostServiceCall(service: service, requestID: id, items: items)) { result in
            // Answered on any thread, at any time, maybe after the engine has gone: only the gate is touched, and
            // through it the loop, which runs the answer only while it accepts tasks (and so while the engine is
            // alive). Once the call has ended, the gate is shut and holds nothing.
            guard let (loop, answer) = gate.take() else { return }
            if loop.inLoop && !loop.runningInline {
                answer(result)
            } else {
                _ = loop.execute { answer(result) }
            }
        }
        if record.hostCalls[call] != nil {
            record.hostCalls[call] = {
                gate.shut()
                cancel()
            }
        }
    }

    /// The app answered call `call` of request `id` (loop thread): to the worker, if the call is still waited for.
    /// An answer too large for a frame becomes an error, so that the call still ends.
    func hostCallAnswered(_ id: RequestID, _ call: Int64, _ result: Result<[ExtensionItem], ExtensionError>) {
        guard let record = requests[id], record.hostCalls.removeValue(forKey: call) != nil, let worker = record.worker,
            worker.inFlight.contains(id), !worker.lifecycle.phase.isOver
        else { return }
        switch result {
        case .success(let items):
            guard answerHostCallUnlessUnread(worker) else { return }
            do {
                try worker.connection.send(.hostCallResult(id: id, call: call, items: items))
                worker.connection.markLastFrame()
            } catch {
                log(.warning, "\(worker.extensionID): the answer to host call \(call) of \(id) cannot be sent: \(error)")
                answerHostCall(.hostCallError(id: id, call: call, error: .answerNotSent(error.detail)), to: worker)
            }
        case .failure(let error): answerHostCall(.hostCallError(id: id, call: call, error: error), to: worker)
        }
    }

    /// Sends `answer` to one of `worker`'s host calls, unless too many of its answers are unread already.
    func answerHostCall(_ answer: Message, to worker: WorkerProcess) {
        guard answerHostCallUnlessUnread(worker) else { return }
        send(answer, to: worker)
        worker.connection.markLastFrame()
    }

    /// Answers to a worker's host calls that may wait in this process, not taken by the kernel because the worker
    /// does not read, before it is ended. A runtime reads its calls' answers: a call is in flight for it until it
    /// has, or it gave up on the call (then the host answers only a call whose answer crossed the give-up). So
    /// answers wait here only while a worker is slow to read, at most its requests' calls in flight (128 at the
    /// defaults); one that calls without reading made the host hold every answer it provoked (20,000 refused
    /// calls: 25 MB; the output limit is 416 MiB at the defaults). Not the policy's product: a manifest may ask for
    /// 1024 × 1024.
    static let maxAnswersWaiting = 4096

    /// Whether another answer may go to `worker`; if not, it is ended as a protocol violation.
    private func answerHostCallUnlessUnread(_ worker: WorkerProcess) -> Bool {
        let most = Self.maxAnswersWaiting
        guard worker.connection.markedFramesQueued >= most else { return true }
        protocolViolation(worker, "worker left \(most) answers to its host calls unread and called again")
        return false
    }

    /// The extension gave up on a call: its handler is cancelled, and no answer goes back. A cancel for a call
    /// that has been answered, or of a request that has ended, crossed the answer or the end: ignored.
    func hostCallCancelled(_ id: RequestID, _ call: Int64, by worker: WorkerProcess) {
        guard let record = requests[id], record.worker === worker, let cancel = record.hostCalls.removeValue(forKey: call)
        else { return }
        cancel()
    }

    /// The request ended or went back to the queue: every call still running in the app is cancelled, and none
    /// is remembered.
    func cancelHostCalls(_ record: RequestRecord) {
        let calls = record.hostCalls
        record.hostCalls = [:]
        for (_, cancel) in calls.sorted(by: { $0.key < $1.key }) { cancel() }
    }
}

/// Where an app's answer to a host call goes: the engine's loop and its handler for the answer, made on the loop
/// while the engine is alive, until the first answer or the call's end (cancelled, its request ended, the host
/// shut down), whichever comes first. After that it holds nothing: an answer that comes later, on any thread and
/// maybe after the engine and its loop are gone, touches neither (an unowned reference to a gone engine read there
/// would trap, a strong one to the loop would keep its descriptors open for as long as the app keeps `done`).
final class HostCallGate: Sendable {
    typealias Answer = @Sendable (Result<[ExtensionItem], ExtensionError>) -> Void
    private let state: Mutex<(loop: EventLoop, answer: Answer)?>

    init(loop: EventLoop, answer: @escaping Answer) {
        state = Mutex((loop, answer))
    }

    /// The loop and the handler, once; nil after the first take or after `shut`.
    func take() -> (loop: EventLoop, answer: Answer)? {
        state.withLock { state in
            defer { state = nil }
            return state
        }
    }

    /// Ends the call: a later answer is dropped.
    func shut() { _ = take() }
}
