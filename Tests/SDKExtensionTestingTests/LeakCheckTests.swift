// The leak assertion's own tests: each leaky graph is found, with its paths; the same graph fixed is clean.
import SDKWire
import SDKExtensionTesting
import Synchronization
import Testing
import XCTest

// MARK: Graphs

final class Parent {
    var child: Child?
    var name = "parent"
}

final class Child: @unchecked Sendable {
    var parent: Parent?  // the cycle
    weak var weakParent: Parent?  // the fix
}

/// Keeps a closure that captures `self`.
final class Observer {
    var onChange: (() -> Void)?
    var count = 0
    func startStrong() { onChange = { [self] in _ = count } }
    func startWeak() { onChange = { [weak self] in _ = self?.count } }
}

/// Starts a Task that captures `self` and never ends (the async/await capture), or one that holds it weakly.
final class Poller: @unchecked Sendable {
    static let tasks = Mutex<[Task<Void, Never>]>([])
    var ticks = 0
    func startStrong() {
        let task = Task { [self] in
            while !Task.isCancelled {
                ticks += 1
                try? await Task.sleep(for: .milliseconds(20))
            }
        }
        Self.tasks.withLock { $0.append(task) }
    }
    func startWeak() {
        let task = Task { [weak self] in
            while !Task.isCancelled, let me = self {
                me.ticks += 1
                try? await Task.sleep(for: .milliseconds(20))
            }
        }
        Self.tasks.withLock { $0.append(task) }
    }
    static func stopAll() { for task in tasks.withLock({ t in defer { t = [] }; return t }) { task.cancel() } }
}

/// A process-wide singleton, referenced from the graph but meant to outlive it.
final class SharedCache: Sendable {
    static let shared = SharedCache()
}

final class UsesShared {
    let cache = SharedCache.shared
    var items: [Child] = [Child(), Child()]
}

final class UsesSharedExempt: LeakCheckExempting {
    static let leakCheckExemptProperties: Set<String> = ["cache"]
    let cache = SharedCache.shared
    var items: [Child] = [Child(), Child()]
}

final class Holder {
    var byName: [String: Child] = [:]
    var maybe: Child?
}

@Suite struct LeakCheckTests {
    @Test func aRetainCycleIsFoundWithItsPaths() async {
        let report = await LeakCheck.run {
            let parent = Parent()
            parent.child = Child()
            parent.child?.parent = parent
            return parent
        }
        #expect(report.survivors.map(\.path) == ["root", "root.child"], "\(report)")
        #expect(report.survivors.map(\.typeName) == ["Parent", "Child"])
        #expect(!report.isClean && report.objectsChecked == 2)
    }

    @Test func theCycleBrokenWithAWeakReferenceIsClean() async {
        let report = await LeakCheck.run {
            let parent = Parent()
            parent.child = Child()
            parent.child?.weakParent = parent
            return parent
        }
        #expect(report.isClean, "\(report)")
        #expect(report.objectsChecked == 2)
    }

    @Test func aClosureCapturingSelfIsFoundAndAWeakCaptureIsClean() async {
        let leaky = await LeakCheck.run {
            let observer = Observer()
            observer.startStrong()
            return observer
        }
        #expect(leaky.survivors.map(\.path) == ["root"], "\(leaky)")
        let fixed = await LeakCheck.run {
            let observer = Observer()
            observer.startWeak()
            return observer
        }
        #expect(fixed.isClean, "\(fixed)")
    }

    @Test func aTaskThatNeverEndsHoldingSelfIsFoundAndAWeakOneIsClean() async {
        defer { Poller.stopAll() }
        let leaky = await LeakCheck.run(timeout: .milliseconds(300)) {
            let poller = Poller()
            poller.startStrong()
            return poller
        }
        #expect(leaky.survivors.map(\.path) == ["root"], "\(leaky)")
        let fixed = await LeakCheck.run {
            let poller = Poller()
            poller.startWeak()
            return poller
        }
        #expect(fixed.isClean, "\(fixed)")
    }

    @Test func exemptPropertiesAreNotFollowed() async {
        let report = await LeakCheck.run { UsesShared() }
        #expect(report.survivors.map(\.path) == ["root.cache"], "the singleton outlives the graph: \(report)")
        let exempt = await LeakCheck.run { UsesSharedExempt() }
        #expect(exempt.isClean && exempt.objectsChecked == 3, "\(exempt)")
    }

    @Test func pathsNameElementsEntriesAndOptionals() async {
        let keep = Mutex<[Child]>([])
        let report = await LeakCheck.run {
            let holder = Holder()
            let a = Child(), b = Child()
            holder.byName = ["a": a]
            holder.maybe = b
            keep.withLock { $0 = [a, b] }  // kept alive from outside: both survive
            return holder
        }
        #expect(Set(report.survivors.map(\.path)) == ["root.byName[a]", "root.maybe"], "\(report)")
        keep.withLock { $0 = [] }
    }

    @Test func expectNoLeaksRecordsAnIssueForALeak() async {
        await withKnownIssue {
            await expectNoLeaks {
                let parent = Parent()
                parent.child = Child()
                parent.child?.parent = parent
                return parent
            }
        }
        let clean = await expectNoLeaks { Parent() }
        #expect(clean.isClean)
    }
}

/// The XCTest form, on a clean graph (XCTest on Linux cannot expect a failure).
final class LeakCheckXCTests: XCTestCase {
    func testXCTAssertNoLeaksPassesForACleanGraph() async {
        let report = await XCTAssertNoLeaks {
            let parent = Parent()
            parent.child = Child()
            parent.child?.weakParent = parent
            return parent
        }
        XCTAssertEqual(report.objectsChecked, 2)
    }
}
