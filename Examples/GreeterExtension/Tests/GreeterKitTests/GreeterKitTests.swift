// An extension author's tests, with SDKExtensionTesting: the handler run in process, and its helper objects
// checked for leaks.
import GreeterKit
import SDKExtensionTesting
import Testing

@Suite struct GreeterKitTests {
    @Test func theHandlerGreetsEveryName() async {
        let run = HandlerHarness.start(GreeterHandler(), items: [ExtensionItem(title: "Ada"), ExtensionItem(title: "Grace")])
        let outcome = await run.outcome()
        guard case .completed(let items) = outcome else {
            Issue.record("not completed: \(outcome)")
            return
        }
        #expect(items.map(\.title) == ["Hello, Ada!", "Hello, Grace!"])
        #expect(await run.contextIsReleased(), "the handler keeps nothing of the request")
    }

    @Test func theHandlerAsksTheAppForANickname() async {
        // The app's `nickname` service, faked: what the handler asked, and what it made of the answer.
        let run = HandlerHarness.start(GreeterHandler(), items: [ExtensionItem(title: "nick:Ada")],
                                       services: ["nickname": { items in [ExtensionItem(title: "Countess \(items[0].title ?? "")")] }])
        #expect(await run.outcome() == .completed([ExtensionItem(title: "Hello, Countess Ada!")]))
        #expect(run.hostCalls.map(\.service) == ["nickname"])
    }

    @Test func theHelpersLeakNothing() async {
        await expectNoLeaks { GreetingDelegate(greeting: "Hi") }
    }

    @Test func aRetainCycleAmongHelpersIsCaught() async {
        let report = await LeakCheck.run { CyclicGreeter.pair() }
        #expect(report.survivors.map(\.path) == ["root", "root.partner"], "\(report)")
        print("caught: \(report)")
    }
}
