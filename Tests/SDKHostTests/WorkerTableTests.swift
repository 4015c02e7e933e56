// WorkerTable on its own, with stand-in workers: a worker is listed in exactly its pool's list from add to
// remove, a move changes its key and its list together, emptied pools vanish, and the table is empty only when
// nothing is listed and nothing waits to be reaped.
import Testing
@testable import SDKHost

#if canImport(Glibc)
import Glibc
#endif

@Suite struct WorkerTableTests {
    final class Stand: PooledWorker {
        var poolKey: String
        let extensionID: String
        let pid: pid_t
        var countsAgainstMaxWorkers = true
        init(_ pool: String, _ pid: pid_t, extensionID: String = "x") {
            poolKey = pool
            self.pid = pid
            self.extensionID = extensionID
        }
    }

    @Test func aWorkerIsListedInItsPoolFromAddToRemove() {
        let table = WorkerTable<Stand>()
        let a = Stand("x", 1), b = Stand("x", 2), c = Stand("x\u{1F}app", 3)
        for w in [a, b, c] { table.add(w) }
        #expect(table.count == 3 && table["x"].map(\.pid) == [1, 2] && table.liveCount(in: "x") == 2)
        b.countsAgainstMaxWorkers = false
        #expect(table.liveCount(in: "x") == 1, "a worker on its way out does not count against MaxWorkers")
        #expect(Set(table.poolKeys(of: "x")) == ["x", "x\u{1F}app"])
        #expect(table.remove(c) && !table.remove(c), "removed once")
        #expect(!table.hasWorkers(in: "x\u{1F}app"), "an emptied pool is gone")
        #expect(table.worker(pid: 2, where: { _ in true }) === b && table.worker(pid: 3, where: { _ in true }) == nil)
    }

    @Test func aMoveChangesTheKeyAndTheListTogether() {
        let table = WorkerTable<Stand>()
        let spare = Stand("x", 1)
        table.add(spare)
        table.move(spare, to: "x\u{1F}1/a")
        #expect(spare.poolKey == "x\u{1F}1/a" && table["x\u{1F}1/a"].first === spare)
        #expect(!table.hasWorkers(in: "x") && table.count == 1)
        let stranger = Stand("y", 2)
        table.move(stranger, to: "z")
        #expect(stranger.poolKey == "y" && table.count == 1, "a worker not listed is not moved")
        #expect(table.remove(spare) && table.count == 0)
    }

    @Test func theTableIsEmptyOnlyWhenNothingIsListedOrWaitsToBeReaped() {
        let table = WorkerTable<Stand>()
        let w = Stand("x", 1)
        table.add(w)
        table.awaitReaping(w)
        table.remove(w)
        #expect(!table.isEmpty, "ended on its exit notice, not reaped yet")
        table.reaped(w)
        #expect(table.isEmpty)
    }
}
