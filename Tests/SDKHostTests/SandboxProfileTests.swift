// The sandbox profile the host hands the launcher: every key with its value, read back with our decoder, for a
// strict manifest with the fewest keys and a bestEffort one with every optional key. The launcher (C) looks each
// key up by name, so a misspelt or missing key would only show as a refused launch.
import Foundation
import Glibc
import HostTestSupport
@testable import SDKHost
import SDKWire
import Testing

@Suite struct SandboxProfileTests {
    func strings(_ list: [String]) -> PlistValue { .array(list.map(PlistValue.string)) }

    func profile(of manifest: ExtensionManifest, premade: String? = nil, measured: Bool = false, network: Int32 = -1,
                 devices: String? = nil, templates: String? = nil) throws -> [String: PlistValue] {
        let spawn = try SandboxProfile.spawn(
            manifest, executable: "/opt/ext/Tool", environment: ["A=1", "TMPDIR=/elsewhere", "B=2"], launcher: "/opt/sdk-host-launcher",
            runtimePaths: ["/usr/lib", "/lib64"], worker: WorkerIdentity(uid: 65534, gid: 65533), temporaryBase: "/tmp",
            premadeDirectory: premade, measured: measured, networkNamespace: network, deviceFolder: devices, rootTemplates: templates)
        #expect(spawn.request.path == "/opt/sdk-host-launcher")
        #expect(spawn.request.arguments == ["sdk-host-launcher", manifest.identifier])
        let bytes = try #require(spawn.request.profile)
        guard case .dictionary(let d) = try BinaryPlistDecoder.decode(bytes) else {
            Issue.record("the profile is not a dictionary")
            return [:]
        }
        return d
    }

    @Test func aStrictProfileHoldsTheRequiredKeys() throws {
        let temp = TemporaryExtension(identifier: "com.example.strict-profile", executable: "Echo")
        defer { temp.remove() }
        let manifest = try ExtensionManifest(contentsOf: "\(temp.root)/Ext/Info.plist", configuration: HostConfiguration(extensionSearchPaths: [temp.root]))
        let d = try profile(of: manifest)
        let policy = manifest.policy
        let expected: [String: PlistValue] = [
            "Extension": .string("com.example.strict-profile"), "Executable": .string("/opt/ext/Tool"), "Arguments": strings(["/opt/ext/Tool"]),
            "Environment": strings(["A=1", "B=2", "TMPDIR=/tmp"]), "HostPID": .integer(Int64(getpid())), "Sandbox": .string("strict"),
            "NetworkAllowed": .bool(policy.networkAllowed), "AllowSubprocesses": .bool(policy.allowSubprocesses),
            "DescriptorLimit": .integer(1024), "ExecutablePaths": strings(["/opt/ext/Tool", "/usr/lib", "/lib64"]),
            "RuntimePaths": strings(["/usr/lib", "/lib64"]), "ReadablePaths": strings(["/sys/devices/system/cpu", "/etc/localtime"]),
            "WritablePaths": strings([]), "WorkerUID": .integer(65534), "WorkerGID": .integer(65533),
            "TempSizeMB": .integer(Int64(policy.tempSizeMB)), "MaxThreads": .integer(Int64(policy.maxThreads)),
        ].merging(policy.memoryLimitMB.map { ["MemoryLimitMB": .integer(Int64($0))] } ?? [:]) { a, _ in a }
        #expect(d == expected)
    }

    /// The launcher (main.c) looks each key up by name: the keys it reads are exactly those the host writes.
    @Test func theLauncherReadsEveryKeyTheHostWrites() throws {
        let source = try String(contentsOfFile: "\(packageRoot)/Sources/sdk-host-launcher/main.c", encoding: .utf8)
        var read = Set<String>()
        for piece in source.components(separatedBy: "_for(&doc, \"").dropFirst() {
            read.insert(String(piece.prefix { $0 != "\"" }))
        }
        let temp = TemporaryExtension(identifier: "com.example.loose-profile", executable: "Echo", policy: """
            <key>Sandbox</key><string>bestEffort</string><key>MemoryLimitMB</key><integer>300</integer>
            <key>ExecutableSHA256</key><string>\(String(repeating: "0", count: 64))</string>
            """)
        defer { temp.remove() }
        let manifest = try ExtensionManifest(contentsOf: "\(temp.root)/Ext/Info.plist", configuration: HostConfiguration(extensionSearchPaths: [temp.root]))
        let written = try profile(of: manifest, premade: "/tmp/w", measured: true, network: 3, devices: "/d", templates: "/t")
        // MaskedPaths is written for an interpreted extension only (InterpreterTests run one).
        #expect(read == Set(written.keys).union(["MaskedPaths"]), "\(read.symmetricDifference(Set(written.keys)))")
    }

    @Test func aBestEffortProfileHoldsEveryOptionalKey() throws {
        let digest = String(repeating: "ab", count: 32)
        let temp = TemporaryExtension(identifier: "com.example.loose-profile", executable: "Echo", policy: """
            <key>Sandbox</key><string>bestEffort</string><key>MemoryLimitMB</key><integer>300</integer>
            <key>ReadablePaths</key><array><string>/srv/data</string></array>
            <key>WritablePaths</key><array><string>/srv/out</string></array>
            <key>ExecutableSHA256</key><string>\(digest)</string>
            """)
        defer { temp.remove() }
        let manifest = try ExtensionManifest(contentsOf: "\(temp.root)/Ext/Info.plist", configuration: HostConfiguration(extensionSearchPaths: [temp.root]))
        let d = try profile(of: manifest, premade: "/tmp/sdk-host-worker.premade", measured: true, network: 9,
                            devices: "/tmp/devices", templates: "/tmp/templates")
        let policy = manifest.policy
        let expected: [String: PlistValue] = [
            "Extension": .string("com.example.loose-profile"), "Executable": .string("/opt/ext/Tool"), "Arguments": strings(["/opt/ext/Tool"]),
            "Environment": strings(["A=1", "B=2", "TMPDIR=/tmp/sdk-host-worker.premade"]), "HostPID": .integer(Int64(getpid())),
            "Sandbox": .string("bestEffort"), "NetworkAllowed": .bool(policy.networkAllowed),
            "AllowSubprocesses": .bool(policy.allowSubprocesses), "DescriptorLimit": .integer(1024),
            "ExecutablePaths": strings(["/opt/ext/Tool", "/usr/lib", "/lib64"]), "RuntimePaths": strings(["/usr/lib", "/lib64"]),
            "ReadablePaths": strings(["/sys/devices/system/cpu", "/etc/localtime", "/srv/data"]),
            "WritablePaths": strings(["/tmp/sdk-host-worker.premade", "/srv/out"]), "WorkerUID": .integer(65534), "WorkerGID": .integer(65533),
            "TempSizeMB": .integer(Int64(policy.tempSizeMB)), "MaxThreads": .integer(Int64(policy.maxThreads)),
            "MemoryLimitMB": .integer(300), "ExecutableSHA256": .string(digest), "Timings": .bool(true), "SharedNetworkNamespace": .bool(true),
            "DeviceFolder": .string("/tmp/devices"), "RootTemplates": .string("/tmp/templates"), "WorkerFolder": .string("/tmp/sdk-host-worker.premade"),
        ]
        #expect(d == expected)
    }
}
