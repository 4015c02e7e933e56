// The app side of memory discipline: a handler that captures its own Extension makes a cycle (the Extension
// keeps the handler, the handler the Extension, the Extension its host), so the host and its event loop live
// until the process ends. The leak check finds it; capturing the Extension weakly is the fix docs/EXTENSIONS.md documents.
import SDKWire
import HostTestSupport
import SDKExtensionTesting
import SDKHost
import Testing

@Suite(.serialized) struct HostCycleTests {
    static func makeHost() -> ExtensionHost {
        try! ExtensionHost(configuration: HostConfiguration(extensionSearchPaths: ["\(packageRoot)/Extensions"]))
    }

    @Test func aHandlerCapturingItsExtensionKeepsTheHostAliveAndAWeakCaptureDoesNot() async throws {
        final class Escape: @unchecked Sendable { weak var ext: Extension? }
        let escape = Escape()
        let leaky = await LeakCheck.run(timeout: .milliseconds(300)) {
            let ext = try! Self.makeHost().extension(identifier: "com.example.echo")
            ext.requestCompletionHandler = { id, _ in _ = ext.pid(for: id) }
            escape.ext = ext
            return ext
        }
        #expect(leaky.survivors.contains { $0.path == "root" && $0.typeName == "Extension" }, "\(leaky)")
        #expect(leaky.survivors.contains { $0.typeName == "ExtensionHost" }, "\(leaky)")
        // Break the cycle so that this test's host goes (and its loop thread with it).
        escape.ext?.requestCompletionHandler = nil
        #expect(await eventually { escape.ext == nil })

        let fixed = await LeakCheck.run(timeout: .seconds(5)) {
            let ext = try! Self.makeHost().extension(identifier: "com.example.echo")
            ext.requestCompletionHandler = { [weak ext] id, _ in _ = ext?.pid(for: id) }
            return ext
        }
        #expect(fixed.isClean, "\(fixed)")
    }
}
