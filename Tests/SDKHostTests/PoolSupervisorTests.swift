// PoolSupervisor on its own: the restart limit quarantines a pool, probation doubles the next quarantine up to
// the cap, a success clears it, and pruning forgets only pools whose record no longer matters.
import Testing
@testable import SDKHost

@Suite struct PoolSupervisorTests {
    static let second: UInt64 = 1_000_000_000

    @Test func theBurstthDeathWithinTheWindowQuarantinesAndOlderDeathsDoNotCount() {
        let supervisor = PoolSupervisor()
        let pool = supervisor.state("x", extensionID: "x", app: nil, restartWindow: 10 * Self.second)
        var now: UInt64 = 100 * Self.second
        #expect(!supervisor.diedOnItsOwn(pool, restartLimitBurst: 3, firstQuarantine: 5, now: now))
        #expect(!supervisor.diedOnItsOwn(pool, restartLimitBurst: 3, firstQuarantine: 5, now: now))
        now += 11 * Self.second  // both fall out of the window
        #expect(!supervisor.diedOnItsOwn(pool, restartLimitBurst: 3, firstQuarantine: 5, now: now))
        #expect(!supervisor.diedOnItsOwn(pool, restartLimitBurst: 3, firstQuarantine: 5, now: now))
        #expect(!supervisor.isQuarantined("x", now: now))
        #expect(supervisor.diedOnItsOwn(pool, restartLimitBurst: 3, firstQuarantine: 5, now: now))
        #expect(supervisor.isQuarantined("x", now: now) && supervisor.isQuarantined("x", now: now + 4 * Self.second))
        #expect(!supervisor.isQuarantined("x", now: now + 5 * Self.second + 1), "over after QuarantineSeconds")
        #expect(!supervisor.isQuarantined("other", now: now), "pools are separate")
        #expect(pool.deaths == 5 && pool.quarantines == 1)
    }

    @Test func aDeathOnProbationDoublesTheQuarantineUpToTheCapAndASuccessClearsIt() {
        let supervisor = PoolSupervisor()
        let pool = supervisor.state("x", extensionID: "x", app: nil, restartWindow: 10 * Self.second)
        var now: UInt64 = 0
        #expect(supervisor.diedOnItsOwn(pool, restartLimitBurst: 1, firstQuarantine: 100, now: now))
        var expected = 100.0
        for _ in 0..<4 {
            now = pool.quarantinedUntil! + 1  // on probation
            #expect(pool.health(now: now) == .probation)
            #expect(supervisor.succeeded("x", now: now - 2) == nil, "a success while quarantined clears nothing")
            #expect(supervisor.diedOnItsOwn(pool, restartLimitBurst: 5, firstQuarantine: 100, now: now),
                    "one death on probation is enough")
            expected = min(expected * 2, maximumQuarantine)
            #expect(pool.backoff == expected)
        }
        #expect(pool.backoff == maximumQuarantine)
        now = pool.quarantinedUntil! + 1
        #expect(supervisor.succeeded("x", now: now) === pool)
        #expect(pool.health(now: now) == .running && pool.backoff == 0 && pool.recentDeaths.isEmpty)
        #expect(!supervisor.diedOnItsOwn(pool, restartLimitBurst: 5, firstQuarantine: 100, now: now), "healthy again")
    }

    @Test func pruningForgetsOnlyIdlePoolsWithNothingThatStillMatters() {
        let supervisor = PoolSupervisor()
        let now: UInt64 = 1000 * Self.second
        let healthy = supervisor.state("a", extensionID: "x", app: "1/a", restartWindow: Self.second)
        _ = supervisor.diedOnItsOwn(healthy, restartLimitBurst: 5, firstQuarantine: 1, now: now - 10 * Self.second)
        let recent = supervisor.state("b", extensionID: "x", app: "1/b", restartWindow: 60 * Self.second)
        _ = supervisor.diedOnItsOwn(recent, restartLimitBurst: 5, firstQuarantine: 1, now: now - 10 * Self.second)
        _ = supervisor.state("busy", extensionID: "x", app: "1/c", restartWindow: Self.second)
        supervisor.prune(now: now) { $0 != "busy" }
        #expect(Set(supervisor.pools.keys) == ["b", "busy"])
    }
}
