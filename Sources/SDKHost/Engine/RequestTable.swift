// RequestTable: the engine's request job. Every request begun and not ended, by id, and per pool the queue of
// those waiting for a worker. Loop-confined, like the rest of the engine's state.
//
// A request is in the table from `insert` until `remove`. While it waits it is also in exactly one queue, its
// pool's; `remove` takes it out of that queue too, and a queue that empties is dropped, so an ended request is
// nowhere and an idle pool holds no queue. The engine decides what happens to a request (HostEngine.swift); the
// table only keeps that state consistent (RequestTableTests).

/// Requests begun and not ended, and the queues of those waiting for a worker.
final class RequestTable {
    // Stored properties `@exclusivity(unchecked)`, here and in the engine's other loop-confined state (WorkerTable,
    // PoolSupervisor, EngineMetrics, RequestRecord, WorkerProcess, the daemon's ClientSession): methods that call
    // nothing that could reach back into them while an access is open (a caller's predicate, as in
    // `first(where:)`, runs over a copy the read has already taken; keep it so), so the runtime's access checks
    // could never fire. Together they were ~1,500 of the ~7,500 checks a simulated schedule made.
    @exclusivity(unchecked) private var records: [RequestID: RequestRecord] = [:]
    @exclusivity(unchecked) private var queues: [String: RequestQueue] = [:]

    /// Requests begun and not ended.
    var count: Int { records.count }
    var isEmpty: Bool { records.isEmpty }
    /// Their ids, in no order.
    var ids: [RequestID] { Array(records.keys) }

    /// The first request, in no order, that satisfies `predicate`.
    func first(where predicate: (RequestRecord) -> Bool) -> RequestRecord? {
        for record in records.values where predicate(record) { return record }
        return nil
    }

    /// The request `id`, if it has not ended.
    subscript(id: RequestID) -> RequestRecord? { records[id] }

    /// Adds a request; false (and nothing changes) if its id is in the table already.
    func insert(_ record: RequestRecord) -> Bool {
        guard records[record.id] == nil else { return false }
        records[record.id] = record
        return true
    }

    /// Takes request `id` out of the table and out of its queue; nil if it has already ended.
    func remove(_ id: RequestID) -> RequestRecord? {
        guard let record = records.removeValue(forKey: id) else { return nil }
        if record.isQueued { unqueue(record) }
        return record
    }

    // MARK: Queues

    /// Requests waiting, in all queues.
    var queuedCount: Int { queues.values.reduce(0) { $0 + $1.count } }
    /// The longest queue's length.
    var longestQueue: Int {
        var longest = 0
        for queue in queues.values { longest = max(longest, queue.count) }
        return longest
    }
    /// The pools with requests waiting.
    var queuedPools: [String] { Array(queues.keys) }

    /// How many wait in pool `key`'s queue.
    func queuedCount(in key: String) -> Int { queues[key]?.count ?? 0 }

    /// The request first in pool `key`'s queue.
    func firstQueued(in key: String) -> RequestRecord? { queues[key]?.first }

    /// Queues `record` (in the table) last in its pool's queue.
    func enqueue(_ record: RequestRecord) {
        precondition(records[record.id] === record, "request \(record.id) queued but not in the table")
        queue(record.poolKey).append(record)
    }

    /// Queues `record` first in its pool's queue: a request whose worker died before running it keeps its place.
    func requeueFirst(_ record: RequestRecord) {
        precondition(records[record.id] === record, "request \(record.id) queued but not in the table")
        queue(record.poolKey).prepend(record)
    }

    /// Takes the first request out of pool `key`'s queue (it stays in the table).
    func popFirst(in key: String) -> RequestRecord? {
        guard let queue = queues[key], let record = queue.popFirst() else { return nil }
        if queue.isEmpty { queues[key] = nil }
        return record
    }

    /// Takes every request out of pool `key`'s queue, oldest first (they stay in the table).
    func dequeueAll(in key: String) -> [RequestRecord] {
        guard let queue = queues.removeValue(forKey: key) else { return [] }
        return queue.removeAll()
    }

    private func queue(_ key: String) -> RequestQueue {
        if let queue = queues[key] { return queue }
        let queue = RequestQueue()
        queues[key] = queue
        return queue
    }

    private func unqueue(_ record: RequestRecord) {
        guard let queue = queues[record.poolKey] else { return }
        queue.remove(record)
        if queue.isEmpty { queues[record.poolKey] = nil }
    }
}
