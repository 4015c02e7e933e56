// Manifests: the bundled ones load with their policies; a bad one is skipped, with an error naming the file and key.
import SDKWire
import HostTestSupport
@testable import SDKHost
import Testing

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
        #expect(manifests["com.example.crasher"]?.policy.requestDeadline == .seconds(10))
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
