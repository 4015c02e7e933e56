// WorkerTable: the engine's worker-pool job. The workers listed per pool, and the workers that ended early on
// their exit notice and wait to be reaped (no longer listed). Loop-confined.
//
// A worker is listed from its spawn (`add`) until it has ended (`remove`), in exactly one pool, its `poolKey`'s;
// a pool that empties is dropped, so an idle pool holds nothing. Moving a worker between pools (a warm spare
// adopted by an app) changes its key and its list together. What a worker does is the engine's; the table only
// keeps where it is consistent (WorkerTableTests, with stand-in workers).

#if canImport(Glibc)
import Glibc
#endif

/// What the table needs of a worker.
protocol PooledWorker: AnyObject {
    var poolKey: String { get set }
    var extensionID: String { get }
    var pid: pid_t { get }
    /// Whether it counts against `MaxWorkers`: starting or ready, and not on its way out.
    var countsAgainstMaxWorkers: Bool { get }
}

/// The workers listed per pool, and those waiting to be reaped. Loop-confined.
final class WorkerTable<Worker: PooledWorker> {
    // Stored properties `@exclusivity(unchecked)`: see RequestTable.
    @exclusivity(unchecked) private var pools: [String: [Worker]] = [:]
    /// Ended on their exit notice and not yet reaped: no longer listed.
    @exclusivity(unchecked) private(set) var dying: [Worker] = []

    /// Pool `key`'s workers, oldest first.
    subscript(key: String) -> [Worker] { pools[key] ?? [] }
    /// Whether pool `key` lists any worker.
    func hasWorkers(in key: String) -> Bool { pools[key] != nil }
    /// Every listed worker.
    var all: FlattenSequence<Dictionary<String, [Worker]>.Values> { pools.values.joined() }
    /// How many are listed.
    var count: Int { pools.values.reduce(0) { $0 + $1.count } }
    /// Pools that list a worker of `extensionID`.
    func poolKeys(of extensionID: String) -> [String] {
        pools.filter { $0.value.first?.extensionID == extensionID }.map { $0.key }
    }
    /// Nothing listed and nothing waiting to be reaped.
    var isEmpty: Bool { pools.isEmpty && dying.isEmpty }

    /// Workers of pool `key` that count against `MaxWorkers`.
    func liveCount(in key: String) -> Int {
        (pools[key] ?? []).reduce(0) { $0 + ($1.countsAgainstMaxWorkers ? 1 : 0) }
    }

    /// Lists a new worker in its pool.
    func add(_ worker: Worker) {
        pools[worker.poolKey, default: []].append(worker)
    }

    /// Takes `worker` out of its pool; false if it was not listed.
    @discardableResult
    func remove(_ worker: Worker) -> Bool {
        guard var list = pools[worker.poolKey], let index = list.firstIndex(where: { $0 === worker }) else { return false }
        list.remove(at: index)
        pools[worker.poolKey] = list.isEmpty ? nil : list
        return true
    }

    /// Moves a listed worker to pool `key`.
    func move(_ worker: Worker, to key: String) {
        guard remove(worker) else { return }
        worker.poolKey = key
        add(worker)
    }

    /// The listed worker `pid` that `matches`.
    func worker(pid: pid_t, where matches: (Worker) -> Bool) -> Worker? {
        all.first { $0.pid == pid && matches($0) }
    }

    /// `worker` ended on its exit notice: it waits here to be reaped (`reaped`).
    func awaitReaping(_ worker: Worker) {
        dying.append(worker)
    }

    /// `worker`, which ended on its exit notice, has been reaped.
    func reaped(_ worker: Worker) {
        dying.removeAll { $0 === worker }
    }
}
