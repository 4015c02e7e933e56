// Host calls on the engine's loop: a worker asks the app's service for something on behalf of a request it runs
// (HostServices.swift; the wire: Messages.swift, "Host services"). A call is checked here, and only a call that
// passes reaches the app: it must belong to a request this worker runs, use a new number, stay within
// MaxHostCallsInFlight, and name a service the manifest lists (else it ends at once with an error to the worker).
// Its answer comes back through the loop and goes to the worker only if the call is still the request's: a
// request that ends (`finish`, however it ends) cancels its calls still running and forgets them, so a late
// answer finds nothing and is dropped.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix

extension HostEngine {
    func hostCall(_ id: RequestID, _ call: Int64, _ service: String, _ items: [ExtensionItem], from worker: WorkerProcess) {
        guard worker.inFlight.contains(id) else {
            protocolViolation(worker, "worker called service '\(OutputLines.escape(Array(service.utf8.prefix(128))))' for a "
                + "request it is not running")
            return
        }
        guard let record = requests[id], record.worker === worker else {
            // Cancelled or timed out here, and the worker has not read its cancel yet: a race, not a fault.
            send(.hostCallError(id: id, call: call, error: .hostCallRequestEnded), to: worker)
            return
        }
        guard call > 0, record.hostCalls[call] == nil else {
            protocolViolation(worker, "worker reused host call number \(call) of request \(id)")
            return
        }
        // The manifest as it is now (a rescan may have changed it); one that has gone allows nothing.
        let policy = manifests[worker.extensionID]?.policy
        let limit = policy?.maxHostCallsInFlight ?? ExtensionPolicy().maxHostCallsInFlight
        guard record.hostCalls.count < limit else {
            protocolViolation(worker, "worker made more than \(limit) host calls of request \(id) at once (MaxHostCallsInFlight)")
            return
        }
        guard policy?.hostServices.contains(service) == true else {
            log(.info, "\(worker.extensionID): call to service '\(OutputLines.escape(Array(service.utf8.prefix(128))))', "
                + "which its HostServices does not list; refused")
            send(.hostCallError(id: id, call: call, error: .serviceNotAllowed(service)), to: worker)
            return
        }
        guard let services = record.services else {
            send(.hostCallError(id: id, call: call, error: .serviceNotProvided(service)), to: worker)
            return
        }
        // Held until the answer is sent or the request ends. The answer always comes back through the loop (even
        // one made at once, for a service the app does not provide), so it finds the call recorded.
        record.hostCalls[call] = services.start(HostServiceCall(service: service, requestID: id, items: items)) {
            [weak self] result in
            guard let self else { return }
            _ = self.loop.execute { self.hostCallAnswered(id, call, result) }
        }
    }

    /// The app answered call `call` of request `id` (loop thread): to the worker, if the call is still waited for.
    func hostCallAnswered(_ id: RequestID, _ call: Int64, _ result: Result<[ExtensionItem], ExtensionError>) {
        guard let record = requests[id], record.hostCalls.removeValue(forKey: call) != nil, let worker = record.worker,
            worker.inFlight.contains(id), !worker.lifecycle.isOver
        else { return }
        switch result {
        case .success(let items): send(.hostCallResult(id: id, call: call, items: items), to: worker)
        case .failure(let error): send(.hostCallError(id: id, call: call, error: error), to: worker)
        }
    }

    /// The extension gave up on a call: its handler is cancelled, and no answer goes back. A cancel for a call
    /// that has been answered, or of a request that has ended, crossed the answer or the end: ignored.
    func hostCallCancelled(_ id: RequestID, _ call: Int64, by worker: WorkerProcess) {
        guard let record = requests[id], record.worker === worker, let cancel = record.hostCalls.removeValue(forKey: call)
        else { return }
        cancel()
    }

    /// The request ended: every call still running in the app is cancelled, and none is remembered.
    func cancelHostCalls(_ record: RequestRecord) {
        let calls = record.hostCalls
        record.hostCalls = [:]
        for (_, cancel) in calls.sorted(by: { $0.key < $1.key }) { cancel() }
    }
}
