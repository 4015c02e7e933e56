// Host services through a real daemon (issue 40): a worker's call goes to the client connection that owns the
// request and runs in that app (the daemon runs no app code); two apps each get only their own calls; a request
// cancelled with three calls out, or whose worker crashes mid-call, cancels the app's handlers; an app that goes
// away fails its calls and its request ends `disconnected`, and the daemon serves on.
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct HostServiceDaemonTests {
    @Test func callsGoToTheAppThatOwnsTheRequestAndNoOther() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let first = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "first")
        let second = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "second")
        let a = try first.extension(identifier: "com.example.renderer")
        let b = try second.extension(identifier: "com.example.renderer")
        let seen = Mutex<(a: [String], b: [String])>(([], []))
        try a.registerService("document.part") { call in
            seen.withLock { $0.a.append(call.items.first?.title ?? "") }
            return [ExtensionItem(text: "a-\(call.items.first?.title ?? "")")]
        }
        try b.registerService("document.part") { call in
            seen.withLock { $0.b.append(call.items.first?.title ?? "") }
            return [ExtensionItem(text: "b-\(call.items.first?.title ?? "")")]
        }
        async let fromA = a.perform([ExtensionItem(text: "{{x}}+{{y}}")])
        async let fromB = b.perform([ExtensionItem(text: "{{p}}")])
        let (outA, outB) = try await (fromA, fromB)
        #expect(outA.first?.text == "a-x+a-y")
        #expect(outB.first?.text == "b-p")
        #expect(seen.withLock { $0.a.sorted() } == ["x", "y"] && seen.withLock { $0.b } == ["p"])
        // A service the app does not provide: the error, from the client, never the daemon's code.
        let echoless = try first.extension(identifier: "com.example.renderer")
        do {
            _ = try await echoless.perform([ExtensionItem(text: "{{z}}")])
            Issue.record("rendered without a service")
        } catch let failure as RequestFailure {
            guard case .cancelled(let error) = failure else { throw failure }
            #expect(error.code == 11, "\(error)")
        }
        await first.shutdown()
        await second.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func filesTravelBothWaysWithACallThroughTheDaemon() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        let renderer = try host.extension(identifier: "com.example.renderer")
        try renderer.registerService("document.part", fileService(ServiceLog()))
        #expect(try await renderer.perform([ExtensionItem(title: "file")]).first?.text == "TRAP DELAES")
        await host.shutdown()
        let released = await eventually(timeout: 10) { StreamingDaemonTests.heldFiles(daemon.pid, "/nonexistent").isEmpty }
        #expect(released, "the daemon keeps a call's file: \(StreamingDaemonTests.heldFiles(daemon.pid, "/nonexistent"))")
        #expect(await daemon.stop() == 0)
    }

    @Test func cancelledWithThreeCallsOutAndCrashedMidCallBothCancelTheHandlers() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        let (renderer, recorder) = try recordedExtension(host, "com.example.renderer")
        let log = ServiceLog()
        try renderer.registerService("document.part", partService(log))
        let id = renderer.beginRequest(withInputItems: [ExtensionItem(title: "hold:3")])
        #expect(await eventually(timeout: 30) { log.started.count == 3 }, "\(log.started)")
        renderer.cancelRequest(id)
        #expect(await recorder.wait(for: id) == .cancelled(.cancelledByHost))
        #expect(await eventually(timeout: 10) { log.cancelled.count == 3 }, "\(log.cancelled)")

        let crash = renderer.beginRequest(withInputItems: [ExtensionItem(title: "crash-in-call")])
        #expect(await recorder.wait(for: crash) == .interrupted(.signal(SIGABRT)))
        #expect(await eventually(timeout: 10) { log.cancelled.contains("crash") }, "\(log.cancelled)")
        #expect(try await renderer.perform([ExtensionItem(text: "{{after}}")]).first?.text == "<AFTER>")
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func anAppThatGoesAwayFailsItsCallsAndItsRequestEndsDisconnected() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let leaving = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "leaving")
        let renderer = try leaving.extension(identifier: "com.example.renderer")
        let log = ServiceLog()
        try renderer.registerService("document.part", partService(log))
        _ = renderer.beginRequest(withInputItems: [ExtensionItem(title: "hold:1")])
        #expect(await eventually(timeout: 30) { log.started.count == 1 })
        await leaving.shutdown()
        // The app's handler is cancelled with its connection; the daemon ends the request `disconnected`.
        #expect(await eventually(timeout: 10) { log.cancelled.count == 1 }, "\(log.cancelled)")
        let watcher = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "watcher")
        func disconnected() async -> [String: Int] {
            await watcher.status()?.extensions.first { $0.identifier == "com.example.renderer" }?.interruptionsByReason ?? [:]
        }
        let ended = await eventually(timeout: 10) { await disconnected()["disconnected", default: 0] == 1 }
        let reasons = await disconnected()
        #expect(ended, "\(reasons)")
        let again = try watcher.extension(identifier: "com.example.renderer")
        try again.registerService("document.part") { _ in [ExtensionItem(text: "ok")] }
        #expect(try await again.perform([ExtensionItem(text: "{{a}}")]).first?.text == "ok")
        await watcher.shutdown()
        #expect(await daemon.stop() == 0)
    }
}
