// Manifests: the bundled ones load with their policies; a bad one is skipped, with an error naming the file and key.
import SDKWire
import HostTestSupport
@testable import SDKHost
import Testing
import Dispatch

#if canImport(Glibc)
import Glibc
#endif

@Suite struct ManifestTests {
    @Test func bundledManifestsLoad() throws {
        let configuration = HostConfiguration(extensionSearchPaths: ["\(packageRoot)/Extensions"])
        let (manifests, problems) = try ExtensionManifest.discover(in: configuration)
        #expect(problems.isEmpty)
        #expect(manifests.keys.sorted() == ["com.example.async-echo", "com.example.crasher", "com.example.crasher-c", "com.example.echo",
                                                 "com.example.echo-python", "com.example.escaper", "com.example.renderer", "com.example.ticker"])
        let echo = try #require(manifests["com.example.echo"])
        #expect(echo.executableName == "Echo")
        #expect(echo.executablePath?.hasSuffix("/Echo") == true)
        #expect(echo.policy.maxConcurrentRequests == 64)
        #expect(echo.policy.memoryLimitMB == 512)
        #expect(manifests["com.example.crasher"]?.policy.requestDeadline == .seconds(120))
        // The Python echo: a script beside its manifest, run by the listed interpreter, its path made absolute.
        if let python = HostConfiguration.defaultInterpreters["/usr/bin/python3"] {
            let echoPython = try #require(manifests["com.example.echo-python"])
            #expect(echoPython.interpreter == "/usr/bin/python3" && echoPython.interpreterLibraryPaths == python)
            #expect(echoPython.executablePath?.hasPrefix("/") == true && echoPython.executablePath?.hasSuffix("/Python/echo.py") == true)
            #expect(echoPython.refusal == nil)
        }
    }

    func loadError(policy: String = "", raw: String? = nil) -> HostError? {
        let temp = TemporaryExtension(identifier: "com.example.bad", executable: "Echo", policy: policy, raw: raw)
        defer { temp.remove() }
        do {
            return try ExtensionManifest.discover(in: HostConfiguration(extensionSearchPaths: [temp.root])).problems.first
        } catch {
            return error
        }
    }

    @Test func illTypedPolicyKeyNamesFileAndKeyPath() {
        let e = loadError(policy: "<key>MaxWorkers</key><string>two</string>")
        #expect(e?.code == .invalidManifest)
        #expect(e?.detail.contains("Ext/Info.plist: NSExtension.SDKHostPolicy.MaxWorkers: expected an integer, found string") == true)
    }

    @Test func unknownPolicyKeyIsRejected() {
        let e = loadError(policy: "<key>MaxWorker</key><integer>2</integer>")
        #expect(e?.detail.contains("NSExtension.SDKHostPolicy.MaxWorker: unknown key") == true)
    }

    @Test func outOfRangeValueIsRejected() {
        let e = loadError(policy: "<key>MaxConcurrentRequests</key><integer>0</integer>")
        #expect(e?.detail.contains("MaxConcurrentRequests: 0 is outside 1...1024") == true)
    }

    @Test func missingIdentifierAndMalformedXML() {
        let missing = loadError(raw: "<plist><dict><key>NSExtension</key><dict/></dict></plist>")
        #expect(missing?.detail.contains("CFBundleIdentifier: missing (required)") == true)
        let broken = loadError(raw: "<plist><dict><key>CFBundleIdentifier</key><string>x</dict></plist>")
        #expect(broken?.code == .invalidManifest)
        #expect(broken?.detail.contains("line 1") == true)
    }

    /// One bad manifest never breaks the others: it is skipped and logged, and asking for it says why, naming
    /// the file and the key. One that is not even a property list is logged and skipped all the same.
    @Test func aBadManifestIsSkippedAndAskingForItSaysWhy() async throws {
        let temp = TemporaryExtension(identifier: "com.example.bad", executable: "Echo",
                                      policy: "<key>NetworkAllowed</key><integer>1</integer>")
        let garbage = TemporaryExtension(identifier: "x", executable: "Echo", raw: "not a plist at all")
        defer { temp.remove(); garbage.remove() }
        try await withHost(extraSearchPaths: [temp.root, garbage.root]) { host, log in
            let reply = try await host.extension(identifier: "com.example.echo").perform([ExtensionItem(title: "ok")])
            #expect(reply.first?.title == "ok")
            #expect {
                _ = try host.extension(identifier: "com.example.bad")
            } throws: { error in
                guard let error = error as? HostError else { return false }
                return error.code == .invalidManifest && error.detail.contains("\(temp.root)/Ext/Info.plist")
                    && error.detail.contains("NetworkAllowed: expected a boolean, found integer")
            }
            #expect(log.contains("\(garbage.root)/Ext/Info.plist"), "\(log.all)")
            #expect(log.contains("skipped, the other extensions are served"))
        }
    }
}

extension ManifestTests {
    /// A manifest that is not a plain file of a manifest's size is refused before it is read, and the others are
    /// served: a FIFO (opening it waited for a writer for ever, and with it the host's start or the daemon's
    /// rescan), a device (a link to /dev/zero was read for ever: gigabytes in seconds; /dev/null here, harmless if
    /// read), a file of megabytes (parsed whole).
    @Test func aManifestThatIsNotASmallPlainFileIsRefusedUnread() throws {
        let fifo = TemporaryExtension(identifier: "com.example.fifo", executable: "Echo")
        let device = TemporaryExtension(identifier: "com.example.device", executable: "Echo")
        let big = TemporaryExtension(identifier: "com.example.big", executable: "Echo")
        defer { fifo.remove(); device.remove(); big.remove() }
        let fifoPath = "\(fifo.root)/Ext/Info.plist"
        unlink(fifoPath)
        #expect(mkfifo(fifoPath, 0o644) == 0)
        unlink("\(device.root)/Ext/Info.plist")
        #expect(symlink("/dev/null", "\(device.root)/Ext/Info.plist") == 0)
        #expect(truncate("\(big.root)/Ext/Info.plist", 2 << 20) == 0)
        let configuration = HostConfiguration(extensionSearchPaths: ["\(packageRoot)/Extensions", fifo.root, device.root, big.root])
        final class Result: @unchecked Sendable { var problems: [HostError] = []; var found: [String] = [] }
        let result = Result()
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            if let (found, problems) = try? ExtensionManifest.discover(in: configuration) {
                result.found = found.filter { $0.value.refusal == nil }.keys.sorted()
                result.problems = problems
            }
            done.signal()
        }
        if done.wait(timeout: .now() + 30) == .timedOut {
            Issue.record("reading the manifests waits on the FIFO")
            // Writers that leave at once, for as long as it takes: each open of the FIFO the reading makes ends.
            while done.wait(timeout: .now() + 0.05) == .timedOut { close(open(fifoPath, O_WRONLY | O_NONBLOCK)) }
        }
        #expect(result.found.contains("com.example.echo"), "\(result.found)")
        let details = result.problems.map(\.detail)
        for (path, why) in [(fifoPath, "not a regular file (a FIFO)"),
                            ("\(device.root)/Ext/Info.plist", "not a regular file (a character device)"),
                            ("\(big.root)/Ext/Info.plist", "at most \(ExtensionManifest.maxManifestBytes) are read")] {
            #expect(details.contains { $0.contains(path) && $0.contains(why) }, "\(why): \(details)")
        }
    }
}

extension ManifestTests {
    /// CFBundleIdentifier names files and lines of output: only a bundle identifier is taken. "../../x" sent the
    /// extension's crash reports out of their folder (none was written, and nothing said so); a newline forged a
    /// line of `sdk-host crashes`.
    @Test func anIdentifierThatIsNotABundleIdentifierIsRefused() throws {
        for bad in ["../../../tmp/x", "a/b", "evil\nsdk-host: error: FORGED", "tab\there", "com..example", ".com", "com.",
                    "caf\u{e9}", "under_score", "sp ace", String(repeating: "a", count: 256)] {
            let temp = TemporaryExtension(identifier: bad, executable: "Echo")
            defer { temp.remove() }
            let configuration = HostConfiguration(extensionSearchPaths: [temp.root])
            #expect {
                _ = try ExtensionManifest(contentsOf: "\(temp.root)/Ext/Info.plist", configuration: configuration)
            } throws: { error in
                let detail = (error as? HostError)?.detail ?? ""
                return detail.contains("CFBundleIdentifier") && detail.contains("is not a bundle identifier")
                    && !detail.contains("\n")
            }
        }
        for good in ["x", "com.example.crasher-c", "A1-b.c9", String(repeating: "a", count: 255)] {
            let temp = TemporaryExtension(identifier: good, executable: "Echo")
            defer { temp.remove() }
            let manifest = try ExtensionManifest(contentsOf: "\(temp.root)/Ext/Info.plist",
                                                 configuration: HostConfiguration(extensionSearchPaths: [temp.root]))
            #expect(manifest.identifier == good)
        }
    }
}

@Suite struct WorkerIdentityTests {
    @Test func aUserIsLookedUpByItsWholeNameAndNeverAsRoot() throws {
        #expect(try WorkerIdentity(resolving: "1234") == WorkerIdentity(uid: 1234, gid: 1234))
        #expect(try WorkerIdentity(resolving: "1234:99") == WorkerIdentity(uid: 1234, gid: 99))
        // nobody: /etc/passwd's entry, or the conventional 65534 where it has none.
        let nobody = try WorkerIdentity(resolving: "nobody")
        #expect(nobody.uid != 0 && nobody.gid != 0)
        // A name is compared whole: a value with a ':' after a real name is no user (it once matched the start of
        // nobody's line), and neither is a prefix of a real name.
        for value in ["nobody:x", "nobody:x:65534", "nobod", "daemon:x"] {
            #expect(throws: HostError.self, "\(value)") { try WorkerIdentity(resolving: value) }
        }
        #expect(throws: HostError.self) { try WorkerIdentity(resolving: "root") }
        #expect(throws: HostError.self) { try WorkerIdentity(resolving: "0") }
        #expect(throws: HostError.self) { try WorkerIdentity(resolving: "12:x") }
    }
}
