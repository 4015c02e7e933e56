// Partial results on the engine's loop: each one from a worker goes to its request's taker or is credited back
// at once; the taker's credit goes back to the worker, never more than it sent (Messages.swift, "Streaming").

#if canImport(Glibc)
import SDKWire
import Glibc
#endif

extension HostEngine {
    /// The app took `count` partial results of `id` (loop thread): its worker may send as many more. Never more
    /// than it has sent: a client cannot open the window wider.
    package func creditOnLoop(_ id: RequestID, _ count: Int) {
        guard count > 0, let worker = requests[id]?.worker, let outstanding = worker.streamOutstanding[id],
            outstanding > 0
        else { return }
        let granted = min(count, outstanding)
        worker.streamOutstanding[id] = outstanding - granted
        send(.credit(id: id, count: Int64(granted)), to: worker)
    }

    /// A partial result from `worker` (loop thread): handed to the request's taker, or credited back at once when
    /// there is none. One more than the window allows is a protocol violation.
    func partialResult(_ id: RequestID, _ items: [ExtensionItem], from worker: WorkerProcess) {
        guard worker.inFlight.contains(id) else {
            if worker.recentlyFinished.contains(id) {
                log(.debug, "\(worker.extensionID): partial result of \(id) after it finished; dropped")
            } else {
                protocolViolation(worker, "partial result for unknown request \(id)")
            }
            return
        }
        let outstanding = (worker.streamOutstanding[id] ?? 0) + 1
        guard outstanding <= streamWindow else {
            protocolViolation(worker, "more than \(streamWindow) partial results of \(id) sent without credit")
            return
        }
        if let record = requests[id], let progress = record.progress {
            worker.streamOutstanding[id] = outstanding
            loop.runOutsideInlineTask { progress(items) }
        } else {
            worker.streamOutstanding[id] = outstanding - 1
            send(.credit(id: id, count: 1), to: worker)
        }
    }
}
