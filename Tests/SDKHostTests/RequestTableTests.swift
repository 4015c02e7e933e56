// RequestTable on its own: a request is in the table from insert to remove, in at most one queue while it
// waits, and nowhere once removed; queues keep their order and vanish when empty.
import Testing
@testable import SDKHost

@Suite struct RequestTableTests {
    func record(_ pool: String = "p") -> RequestRecord {
        let record = RequestRecord(id: RequestID(), extensionID: "x", items: [], deadline: nil, deliver: { _ in })
        record.poolKey = pool
        return record
    }

    @Test func aSecondRequestWithTheSameIdIsRefusedAndChangesNothing() {
        let table = RequestTable()
        let first = record()
        #expect(table.insert(first))
        let twin = RequestRecord(id: first.id, extensionID: "y", items: [], deadline: nil, deliver: { _ in })
        #expect(!table.insert(twin))
        #expect(table.count == 1 && table[first.id] === first)
    }

    @Test func removingAQueuedRequestTakesItOutOfItsQueueAndDropsAnEmptyQueue() {
        let table = RequestTable()
        let a = record("p"), b = record("p"), c = record("q")
        for r in [a, b, c] {
            #expect(table.insert(r))
            table.enqueue(r)
        }
        #expect(table.queuedCount == 3 && table.queuedCount(in: "p") == 2 && table.longestQueue == 2)
        #expect(table.remove(a.id) === a)
        #expect(!a.isQueued && table[a.id] == nil)
        #expect(table.queuedCount(in: "p") == 1 && table.firstQueued(in: "p") === b)
        #expect(table.remove(c.id) === c)
        #expect(Set(table.queuedPools) == ["p"], "q's queue emptied and is gone")
        #expect(table.remove(c.id) == nil, "removed once")
        #expect(table.count == 1)
    }

    @Test func firstWhereSeesEveryRequestHeldAndNoneRemoved() {
        let table = RequestTable()
        let a = record("p"), b = record("q")
        #expect(table.first { _ in true } == nil)
        #expect(table.insert(a) && table.insert(b))
        #expect(table.first { $0.poolKey == "q" } === b)
        #expect(table.first { $0.poolKey == "r" } == nil)
        #expect(table.remove(b.id) === b)
        #expect(table.first { $0.poolKey == "q" } == nil, "a removed request is not seen")
    }

    @Test func queuesKeepTheirOrderAndARequeuedRequestGoesFirst() {
        let table = RequestTable()
        let a = record(), b = record(), c = record()
        for r in [a, b] {
            #expect(table.insert(r))
            table.enqueue(r)
        }
        #expect(table.insert(c))
        table.requeueFirst(c)
        #expect(table.popFirst(in: "p") === c)
        #expect(table.popFirst(in: "p") === a)
        #expect(table.count == 3, "popped requests stay in the table until they end")
        #expect(table.dequeueAll(in: "p").map(\.id) == [b.id])
        #expect(table.queuedPools.isEmpty && table.popFirst(in: "p") == nil)
        for id in table.ids { #expect(table.remove(id) != nil) }
        #expect(table.isEmpty)
    }
}
