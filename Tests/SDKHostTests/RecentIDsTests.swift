// RecentIDs on its own: the ids a worker finished lately (a late reply to one is not a protocol error). It remembers
// exactly the last `capacity` ids inserted, and forgets the oldest first, while its ring fills and after it wraps.
import Testing
@testable import SDKHost
import SDKWire

@Suite struct RecentIDsTests {
    private func id(_ n: UInt64) -> RequestID { RequestID(high: 7, low: n) }

    @Test func remembersTheLastCapacityIdsAndForgetsTheOldestFirst() {
        var recent = RecentIDs(capacity: 3)
        #expect(!recent.contains(id(1)))
        recent.insert(id(1))
        recent.insert(id(2))
        #expect(recent.contains(id(1)) && recent.contains(id(2)) && !recent.contains(id(3)))
        recent.insert(id(3))
        recent.insert(id(4))
        #expect(!recent.contains(id(1)), "the oldest goes first once the ring is full")
        #expect(recent.contains(id(2)) && recent.contains(id(3)) && recent.contains(id(4)))
        for n: UInt64 in 5...9 { recent.insert(id(n)) }
        #expect((UInt64(1)...6).allSatisfy { !recent.contains(id($0)) })
        #expect((UInt64(7)...9).allSatisfy { recent.contains(id($0)) }, "after wrapping, still exactly the last three")
    }
}
