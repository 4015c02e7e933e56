// What `sdk-host conformance` needs of the engine beyond the API: bytes written to a worker as they are (a
// malformed or oversized frame, a message of a type no version knows yet), to see that the worker copes.

#if canImport(Glibc)
import Glibc
#endif
import SDKPosix

extension HostEngine {
    /// Writes `bytes` unframed and unchecked to the live worker `pid` (as `pid(for:)` reports it), on the loop;
    /// `completion` says whether there was such a worker with its connection open.
    package func sendRaw(_ bytes: [UInt8], toWorker pid: pid_t, completion: @escaping @Sendable (Bool) -> Void) {
        let queued = loop.execute { [unowned self] in
            guard let worker = workers.worker(pid: pid, where: { $0.connection.isOpen && !$0.lifecycle.phase.isOver }) else {
                return completion(false)
            }
            worker.connection.sendUnchecked(bytes)
            completion(true)
        }
        if !queued { completion(false) }
    }
}
