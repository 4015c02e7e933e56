// ExtensionContext: the first finish wins; later ones are no-ops (logged), never a second message.
@testable import SDKExtension
import SDKWire
import Synchronization
import Testing

/// The messages a context sent.
final class Sent: Sendable {
    private let messages = Mutex<[Message]>([])
    func append(_ m: Message) { messages.withLock { $0.append(m) } }
    var all: [Message] { messages.withLock { $0 } }
}

@Suite struct ExtensionContextTests {
    func context(_ sent: Sent) -> ExtensionContext {
        ExtensionContext(requestID: RequestID(), inputItems: [ExtensionItem(title: "in")]) { sent.append($0) }
    }

    @Test func completingTwiceSendsOneMessage() {
        let sent = Sent()
        let c = context(sent)
        c.completeRequest(returningItems: [ExtensionItem(title: "a")])
        c.completeRequest(returningItems: [ExtensionItem(title: "b")])
        c.cancelRequest(withError: ExtensionError.cancelledByHost)
        #expect(sent.all == [.complete(id: c.requestID, items: [ExtensionItem(title: "a")])])
        #expect(c.isFinished)
    }

    @Test func concurrentFinishesSendExactlyOne() async {
        let sent = Sent()
        let c = context(sent)
        await withTaskGroup(of: Void.self) { group in
            for i in 0..<32 {
                group.addTask {
                    if i % 2 == 0 {
                        c.completeRequest(returningItems: [])
                    } else {
                        c.cancelRequest(withError: ExtensionError(domain: "t", code: Int64(i), message: "x"))
                    }
                }
            }
        }
        #expect(sent.all.count == 1)
    }

    @Test func hostCancellationIsVisibleAndCancelsTheTask() async {
        let sent = Sent()
        let c = context(sent)
        let task = Task<Void, Never> { while !Task.isCancelled { await Task.yield() } }
        c.attach(task)
        #expect(!c.isCancelled)
        c.markCancelledByHost()
        #expect(c.isCancelled)
        await task.value  // returns only because the task was cancelled
        #expect(task.isCancelled)
    }
}
