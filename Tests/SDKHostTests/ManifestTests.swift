// Manifests: the bundled ones load with their policies; a bad one is a startup error naming the file and key.
import SDKWire
import HostTestSupport
@testable import SDKHost
import Testing

@Suite struct ManifestTests {
    @Test func bundledManifestsLoad() throws {
        let configuration = HostConfiguration(extensionSearchPaths: ["\(packageRoot)/Extensions"])
        let manifests = try ExtensionManifest.discover(in: configuration)
        #expect(manifests.keys.sorted() == ["com.example.async-echo", "com.example.crasher", "com.example.echo", "com.example.escaper", "com.example.ticker"])
        let echo = try #require(manifests["com.example.echo"])
        #expect(echo.executableName == "Echo")
        #expect(echo.executablePath?.hasSuffix("/Echo") == true)
        #expect(echo.policy.maxConcurrentRequests == 64)
        #expect(echo.policy.memoryLimitMB == 512)
        #expect(manifests["com.example.crasher"]?.policy.requestDeadline == 10)
    }

    func loadError(policy: String = "", raw: String? = nil) -> HostError? {
        let temp = TemporaryExtension(identifier: "com.example.bad", executable: "Echo", policy: policy, raw: raw)
        defer { temp.remove() }
        do {
            _ = try ExtensionManifest.discover(in: HostConfiguration(extensionSearchPaths: [temp.root]))
            return nil
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

    @Test func hostInitSurfacesManifestErrors() {
        let temp = TemporaryExtension(identifier: "com.example.bad", executable: "Echo",
                                      policy: "<key>NetworkAllowed</key><integer>1</integer>")
        defer { temp.remove() }
        #expect {
            _ = try ExtensionHost(configuration: HostConfiguration(extensionSearchPaths: [temp.root]))
        } throws: { error in
            (error as? HostError)?.detail.contains("NetworkAllowed: expected a boolean, found integer") == true
        }
    }
}
