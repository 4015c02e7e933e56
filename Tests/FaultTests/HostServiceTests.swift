// Host services (issue 40), embedded: a sandboxed extension (Renderer) asks the app for what it cannot reach. A
// call ends exactly once for the extension; a call the manifest does not list, or the app does not provide, never
// reaches the app's code; MaxHostCallsInFlight holds; and when a request ends (cancelled with three calls out, or
// its worker crashing mid-call) the app's handlers see their Task cancelled and nothing of them is kept. A worker
// that breaks the rules (calls for a request it does not run, reuses a number, floods past the limit) is a
// protocol violation. Real workers throughout.
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
import Synchronization
import Testing
import Dispatch

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct HostServiceTests {
    @Test func anExtensionRendersADocumentWithPartsOnlyTheAppHas() async throws {
        try await withHost { host, _ in
            let renderer = try host.extension(identifier: "com.example.renderer")
            let log = ServiceLog()
            try renderer.registerService("document.part", partService(log))
            let out = try await renderer.perform([ExtensionItem(text: "Dear {{name}}, see {{page}}.")])
            #expect(out.first?.text == "Dear <NAME>, see <PAGE>.")
            #expect(log.finished == ["name", "page"])
            // The blocking form, from a synchronous thread, reaches the same service.
            let blocking = try await renderer.perform([ExtensionItem(title: "blocking", text: "[{{a}}|{{b}}]")])
            #expect(blocking.first?.text == "[<A>|<B>]")
        }
    }

    @Test func aServiceTheAppDoesNotProvideOrTheManifestDoesNotListNeverReachesTheApp() async throws {
        try await withHost { host, _ in
            let renderer = try host.extension(identifier: "com.example.renderer")
            // Nothing registered: the extension's call ends with the error, and the request with it.
            do {
                _ = try await renderer.perform([ExtensionItem(text: "{{x}}")])
                Issue.record("rendered without the service")
            } catch let failure as RequestFailure {
                guard case .cancelled(let error) = failure else { throw failure }
                #expect(error.domain == "SDKHost" && error.code == 11 && error.message.contains("document.part"), "\(error)")
            }
            // `secret.key` is provided by the app but not listed by the manifest: refused before the app's code.
            let log = ServiceLog()
            try renderer.registerService("secret.key") { call in
                log.started(call.service)
                return [ExtensionItem(text: "hunter2")]
            }
            let out = try await renderer.perform([ExtensionItem(title: "unlisted")])
            #expect(out.first?.text?.contains("is not in this extension's HostServices") == true, "\(out)")
            #expect(log.started.isEmpty, "the app's handler ran: \(log.started)")
            // A handler's own error reaches the extension as it is.
            try renderer.registerService("document.part") { _ in
                throw ExtensionError(domain: "com.example.app", code: 7, message: "no such part")
            }
            do {
                _ = try await renderer.perform([ExtensionItem(text: "{{x}}")])
                Issue.record("rendered although the service threw")
            } catch let failure as RequestFailure {
                guard case .cancelled(let error) = failure else { throw failure }
                #expect(error == ExtensionError(domain: "com.example.app", code: 7, message: "no such part"))
            }
            #expect(throws: HostError.self) { try renderer.registerService("bad name!") { _ in [] } }
        }
    }

    @Test func aRequestCancelledWithThreeCallsOutCancelsEachHandlerAndKeepsNothing() async throws {
        try await withHost { host, _ in
            let (renderer, recorder) = try recordedExtension(host, "com.example.renderer")
            let log = ServiceLog()
            try renderer.registerService("document.part", partService(log))
            let id = renderer.beginRequest(withInputItems: [ExtensionItem(title: "hold:3")])
            #expect(await eventually(timeout: 30) { log.started.count == 3 }, "calls started: \(log.started)")
            renderer.cancelRequest(id)
            #expect(await recorder.wait(for: id) == .cancelled(.cancelledByHost))
            #expect(await eventually(timeout: 10) { log.cancelled.count == 3 }, "handlers cancelled: \(log.cancelled)")
            #expect(log.finished.isEmpty)
            #expect(recorder.callbacks(id).count == 1)
            // The worker serves on: its calls ended with the request (none left waiting on either side).
            #expect(try await renderer.perform([ExtensionItem(text: "{{after}}")]).first?.text == "<AFTER>")
        }
    }

    @Test func callsCarryFilesBothWaysAndARequestThatCompletesCancelsItsCallsStillOut() async throws {
        try await withHost { host, _ in
            let (renderer, recorder) = try recordedExtension(host, "com.example.renderer")
            try renderer.registerService("document.part", fileService(ServiceLog()))
            #expect(try await renderer.perform([ExtensionItem(title: "file")]).first?.text == "TRAP DELAES")
            let log = ServiceLog()
            try renderer.registerService("document.part", partService(log))
            let id = renderer.beginRequest(withInputItems: [ExtensionItem(title: "end-with-call")])
            #expect(await recorder.wait(for: id) == .completed([ExtensionItem(text: "ended")]))
            #expect(await eventually(timeout: 10) { log.cancelled == ["hold-end"] }, "\(log.started) \(log.cancelled)")
        }
    }

    @Test func aDeadlineOrAShutdownWithCallsOutCancelsTheirHandlers() async throws {
        try await withHost { host, _ in
            let (renderer, recorder) = try recordedExtension(host, "com.example.renderer")
            let log = ServiceLog()
            try renderer.registerService("document.part", partService(log))
            let late = renderer.beginRequest(withInputItems: [ExtensionItem(title: "hold:2")], deadline: .seconds(1))
            #expect(await recorder.wait(for: late) == .interrupted(.timedOut))
            #expect(await eventually(timeout: 10) { log.cancelled.count == 2 }, "\(log.cancelled)")
            let running = renderer.beginRequest(withInputItems: [ExtensionItem(title: "hold:2")])
            #expect(await eventually(timeout: 30) { log.started.count == 4 }, "\(log.started)")
            await host.shutdown()
            #expect(await recorder.wait(for: running) == .interrupted(.hostShutdown))
            #expect(await eventually(timeout: 10) { log.cancelled.count == 4 }, "\(log.cancelled)")
            #expect(log.finished.isEmpty)
        }
    }

    /// A handler may answer after its cancel ("after it, `done` may still run"), and so after the host has shut
    /// down and the app has dropped it: the answer is dropped, and touches nothing of the gone engine. (Made to skip
    /// a side table, the answer's closure once held the engine unowned and read it there: the process trapped.)
    @Test func anAnswerThatComesAfterTheHostIsGoneIsDropped() async throws {
        await warmUpOnce()
        let log = ServiceLog()
        weak var gone: HostEngine?
        do {
            let (host, _) = try makeHost()
            gone = host.engine
            let (renderer, recorder) = try recordedExtension(host, "com.example.renderer")
            // Ignores its Task's cancellation: answers only when the log is released.
            try renderer.registerService("document.part") { call in
                let name = call.items.first?.title ?? ""
                log.started(name)
                await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                    DispatchQueue.global().async {
                        while !log.released { usleep(5_000) }
                        done.resume()
                    }
                }
                log.finished(name)
                return [ExtensionItem(text: "late")]
            }
            let request = renderer.beginRequest(withInputItems: [ExtensionItem(title: "hold:2")])
            #expect(await eventually(timeout: 30) { log.started.count == 2 }, "\(log.started)")
            await host.shutdown()
            #expect(await recorder.wait(for: request) == .interrupted(.hostShutdown))
        }
        #expect(await eventually(timeout: 10) { gone == nil }, "the engine is still referenced after shutdown")
        log.release()
        #expect(await eventually(timeout: 10) { log.finished.count == 2 }, "\(log.finished)")
        // The answers have gone to `done` by now, or go within a few ms: give them the time to do harm.
        try await Task.sleep(nanoseconds: 300_000_000)
    }

    @Test func aWorkerThatCrashesMidCallCancelsTheCall() async throws {
        try await withHost { host, _ in
            let (renderer, recorder) = try recordedExtension(host, "com.example.renderer")
            let log = ServiceLog()
            try renderer.registerService("document.part", partService(log))
            let id = renderer.beginRequest(withInputItems: [ExtensionItem(title: "crash-in-call")])
            let outcome = await recorder.wait(for: id)
            #expect(outcome == .interrupted(.signal(SIGABRT)), "\(String(describing: outcome))")
            #expect(log.started == ["crash"])
            #expect(await eventually(timeout: 10) { log.cancelled == ["crash"] }, "handler not cancelled: \(log.cancelled)")
        }
    }

    @Test func callsPastMaxHostCallsInFlightFailAtOnceInTheWorker() async throws {
        let capped = TemporaryExtension(identifier: "com.example.renderer-capped", executable: "Renderer", policy: """
            <key>HostServices</key><array><string>document.part</string></array>
            <key>MaxHostCallsInFlight</key><integer>3</integer>
            """)
        defer { capped.remove() }
        try await withHost(extraSearchPaths: [capped.root]) { host, _ in
            let renderer = try host.extension(identifier: capped.identifier)
            let log = ServiceLog()
            try renderer.registerService("document.part", partService(log))
            let task = renderer.start([ExtensionItem(title: "over-cap:5")])
            // Three reach the app; two fail in the worker at once, never sent.
            #expect(await eventually(timeout: 30) { log.started.count == 3 })
            try await Task.sleep(nanoseconds: 200_000_000)
            #expect(log.started.count == 3, "\(log.started)")
            log.release()
            #expect(try await task.value.first?.text == "2 failed")
        }
    }

    @Test(arguments: [("call-other", "for a request it is not running"), ("call-reuse", "reused host call number 7"),
                      ("call-zero", "numbered a host call 0 in request"), ("call-flood", "more than 16 host calls")])
    func aWorkerThatBreaksTheCallRulesIsAProtocolViolation(_ command: String, _ expected: String) async throws {
        let hostile = TemporaryExtension(identifier: "com.example.hostile-caller", executable: "Crasher",
                                         policy: "<key>HostServices</key><array><string>document.part</string></array>")
        defer { hostile.remove() }
        try await withHost(extraSearchPaths: [hostile.root]) { host, log in
            let (crasher, recorder) = try recordedExtension(host, hostile.identifier)
            let services = ServiceLog()
            try crasher.registerService("document.part", partService(services))
            let id = crasher.beginRequest(withInputItems: [ExtensionItem(title: command)])
            let outcome = await recorder.wait(for: id)
            guard case .interrupted(.protocolViolation(let detail))? = outcome else {
                Issue.record("\(command): \(String(describing: outcome))")
                return
            }
            #expect(detail.contains(expected), "\(detail)")
            // Whatever reached the app before the violation was cancelled with the request.
            #expect(await eventually(timeout: 10) { services.cancelled.count == services.started.count },
                    "started \(services.started), cancelled \(services.cancelled)")
            if command == "call-other" { #expect(services.started.isEmpty) }
            if command == "call-flood" { #expect(services.started.count <= 16) }
            #expect(log.contains("broke the protocol"))
            #expect(try await bystanderEcho(host, "after \(command)") == .completed([ExtensionItem(title: "after \(command)")]))
        }
    }

    @Test func aCallThatCrossesItsRequestsEndIsAnsweredAndACallBeforeTheHandshakeIsNot() async throws {
        let caller = TemporaryExtension(identifier: "com.example.late-caller", executable: "Crasher",
                                        policy: "<key>HostServices</key><array><string>document.part</string></array>")
        defer { caller.remove() }
        try await withHost(extraSearchPaths: [caller.root]) { host, log in
            let crasher = try host.extension(identifier: caller.identifier)
            let services = ServiceLog()
            try crasher.registerService("document.part", partService(services))
            let (_, first) = beginNotingPid(crasher, "call-after-end")
            #expect(await eventually(timeout: 30) { first.pid != 0 })
            try await Task.sleep(nanoseconds: 300_000_000)
            // Not a protocol violation: the same worker serves the next request; the app saw no call.
            let (_, second) = beginNotingPid(crasher, "echo")
            #expect(await eventually(timeout: 30) { second.pid != 0 })
            #expect(second.pid == first.pid, "the worker was replaced: \(log.all)")
            #expect(!log.contains("broke the protocol"), "\(log.all)")
            #expect(services.started.isEmpty)
        }
        try await withHost({ $0.workerEnvironment = ["CRASHER_FAULT_AT_START=call-early"] }) { host, _ in
            let (crasher, recorder) = try recordedExtension(host, "com.example.crasher")
            let id = crasher.beginRequest(withInputItems: [ExtensionItem(title: "echo")])
            let outcome = await recorder.wait(for: id)
            guard case .interrupted(.protocolViolation(let detail))? = outcome else {
                Issue.record("\(String(describing: outcome))")
                return
            }
            #expect(detail == "worker sent 'hostCall' before its 'welcome'", "\(detail)")
        }
    }

    @Test func theCallsManifestKeysAreChecked() {
        expectManifestErrors([
            ("<key>HostServices</key><string>document.part</string>", "HostServices"),
            ("<key>HostServices</key><array><string>has space</string></array>", "is not a service name"),
            ("<key>MaxHostCallsInFlight</key><integer>0</integer>", "MaxHostCallsInFlight"),
            ("<key>MaxHostCallsInFlight</key><integer>2000</integer>", "MaxHostCallsInFlight"),
        ], executable: "Renderer")
    }

    @Test func aMainActorHandlerServesCalls() async throws {
        try await withHost { host, _ in
            let renderer = try host.extension(identifier: "com.example.renderer")
            try renderer.registerService("document.part") { @MainActor call in
                MainActor.assertIsolated()
                return [ExtensionItem(text: "main:\(call.items.first?.title ?? "")")]
            }
            #expect(try await renderer.perform([ExtensionItem(text: "{{a}}")]).first?.text == "main:a")
        }
    }
}
