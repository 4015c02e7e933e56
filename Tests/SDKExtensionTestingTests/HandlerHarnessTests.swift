// The in-process harness: handlers run against items with a real ExtensionContext, no worker spawned; every
// outcome (completed, cancelled by the harness or by the handler, timed out) and the context's release.
import SDKWire
import SDKExtensionTesting
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

struct Upper: RequestHandler {
    static var runsInline: Bool { true }
    func beginRequest(with context: ExtensionContext) {
        context.completeRequest(returningItems: context.inputItems.map { ExtensionItem(title: $0.title?.uppercased()) })
    }
}

/// Works until cancelled, as a long-running handler should.
struct Patient: RequestHandler {
    func beginRequest(with context: ExtensionContext) {
        while !context.isCancelled { usleep(1000) }
        context.cancelRequest(withError: .cancelledByHost)
    }
}

/// Streams 40 partial results (more than the 16 of credit: the harness takes each at once), then completes.
struct Counter: AsyncRequestHandler {
    func beginRequest(with context: ExtensionContext) async {
        for i in 0..<40 { await context.send([ExtensionItem(title: "\(i)")]) }
        context.completeRequest(returningItems: [])
        #expect(await context.send([ExtensionItem(title: "late")]) == false)
    }
}

/// Never finishes, and does not hold on to the context either.
struct Forgetful: RequestHandler {
    func beginRequest(with context: ExtensionContext) {}
}

enum Hoard {
    static let contexts = Mutex<[ExtensionContext]>([])
}

/// Finishes, but keeps the context: a leak.
struct Hoarder: RequestHandler {
    func beginRequest(with context: ExtensionContext) {
        Hoard.contexts.withLock { $0.append(context) }
        context.completeRequest(returningItems: [])
    }
}

struct AsyncSleeper: AsyncRequestHandler {
    func beginRequest(with context: ExtensionContext) async {
        do {
            try await Task.sleep(for: .seconds(30))
            context.completeRequest(returningItems: [ExtensionItem(title: "woke")])
        } catch {}  // cancelled: the runtime (here the harness) finishes the request as cancelled by the host
    }
}

struct AsyncReturnsEarly: AsyncRequestHandler {
    func beginRequest(with context: ExtensionContext) async {}
}

@Suite struct HandlerHarnessTests {
    @Test func partialResultsAreCollectedInOrder() async {
        let run = HandlerHarness.start(Counter(), items: [])
        #expect(await run.outcome(timeout: .seconds(30)) == .completed([]))
        #expect(run.partialResults.map { $0.first?.title } == (0..<40).map { "\($0)" })
    }

    @Test func aSyncHandlerCompletesAndLetsGoOfItsContext() async {
        let run = HandlerHarness.start(Upper(), items: [ExtensionItem(title: "hi"), ExtensionItem(title: "there")])
        #expect(await run.outcome() == .completed([ExtensionItem(title: "HI"), ExtensionItem(title: "THERE")]))
        #expect(await run.contextIsReleased())
        #expect(await HandlerHarness.run(Upper(), items: [ExtensionItem(title: "x")]) == .completed([ExtensionItem(title: "X")]))
    }

    @Test func cancellingReachesTheHandler() async {
        let run = HandlerHarness.start(Patient(), items: [])
        #expect(await run.outcome(timeout: .milliseconds(100)) == .timedOut, "still working")
        run.cancel()
        #expect(await run.outcome() == .cancelled(.cancelledByHost))
        #expect(await run.contextIsReleased())
    }

    @Test func aHandlerThatNeverFinishesTimesOut() async {
        #expect(await HandlerHarness.run(Forgetful(), items: [], timeout: .milliseconds(200)) == .timedOut)
    }

    @Test func aHandlerThatKeepsItsContextIsCaught() async {
        defer { Hoard.contexts.withLock { $0 = [] } }
        let run = HandlerHarness.start(Hoarder(), items: [])
        #expect(await run.outcome() == .completed([]))
        #expect(await run.contextIsReleased(within: .milliseconds(200)) == false)
    }

    @Test func asyncHandlersAreCancelledThroughTheirTaskAndFinishedIfTheyReturnEarly() async {
        let sleeper = HandlerHarness.start(AsyncSleeper(), items: [])
        try? await Task.sleep(for: .milliseconds(50))
        sleeper.cancel()
        #expect(await sleeper.outcome() == .cancelled(.cancelledByHost))
        #expect(await sleeper.contextIsReleased())
        guard case .cancelled(let error) = await HandlerHarness.run(AsyncReturnsEarly(), items: []) else {
            Issue.record("not cancelled")
            return
        }
        #expect(error.domain == "SDKExtension" && error.code == 2, "\(error)")
    }
}

/// Asks the app's `lookup` service for each input item's title and completes with the answers.
struct Looker: AsyncRequestHandler {
    func beginRequest(with context: ExtensionContext) async {
        do {
            var out: [ExtensionItem] = []
            for item in context.inputItems { out += try await context.callHost("lookup", [item]) }
            context.completeRequest(returningItems: out)
        } catch let error as ExtensionError {
            context.cancelRequest(withError: error)
        } catch {
            context.cancelRequest(withError: .cancelledByHost)
        }
    }
}

@Suite struct HarnessHostServiceTests {
    @Test func fakeServicesAnswerAHandlersHostCalls() async {
        let run = HandlerHarness.start(Looker(), items: [ExtensionItem(title: "a"), ExtensionItem(title: "b")],
                                       services: ["lookup": { items in [ExtensionItem(text: "found \(items[0].title ?? "")")] }])
        #expect(await run.outcome() == .completed([ExtensionItem(text: "found a"), ExtensionItem(text: "found b")]))
        #expect(run.hostCalls.map(\.service) == ["lookup", "lookup"])
        #expect(await run.contextIsReleased())
    }

    @Test func aServiceNotFakedFailsAsAnUnprovidedOne() async {
        let outcome = await HandlerHarness.run(Looker(), items: [ExtensionItem(title: "a")])
        guard case .cancelled(let error) = outcome else {
            Issue.record("\(outcome)")
            return
        }
        #expect(error.domain == "SDKHost" && error.code == 11 && error.message.contains("lookup"))
    }

    @Test func cancellingTheRequestCancelsTheFakesCall() async {
        let fakeCancelled = Mutex(false)
        let run = HandlerHarness.start(Looker(), items: [ExtensionItem(title: "slow")], services: ["lookup": { _ in
            while !Task.isCancelled { try? await Task.sleep(nanoseconds: 2_000_000) }
            fakeCancelled.withLock { $0 = true }
            throw CancellationError()
        }])
        for _ in 0..<500 where run.hostCalls.isEmpty { try? await Task.sleep(nanoseconds: 2_000_000) }
        #expect(run.hostCalls.count == 1)
        run.cancel()
        #expect(await run.outcome() == .cancelled(.cancelledByHost))
        for _ in 0..<500 where !fakeCancelled.withLock({ $0 }) { try? await Task.sleep(nanoseconds: 2_000_000) }
        #expect(fakeCancelled.withLock { $0 }, "the fake's Task was not cancelled")
    }
}
