// The host trusts no bytes of an extension's files (shared/DESIGN.md "Sandbox"): a manifest, folder or executable
// that another user owns or others may write is refused, naming the file; ExecutableSHA256 is checked on what is
// exec'ed; no manifest exceeds the operator's ceilings. A refused extension never takes the others down.
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct TrustTests {
    /// The request's outcome, or the error `extension(identifier:)` threw.
    func attempt(_ host: ExtensionHost, _ identifier: String) async -> String {
        do {
            let (ext, recorder) = try recordedExtension(host, identifier)
            let id = ext.beginRequest(withInputItems: [ExtensionItem(title: "hello")], deadline: 60)
            switch await recorder.wait(for: id, timeout: 90) {
            case .completed(let items)?: return "completed \(items.first?.title ?? "")"
            case let other?: return "\(other)"
            case nil: return "no outcome"
            }
        } catch let error as HostError {
            return "\(error.code): \(error.detail)"
        } catch {
            return "\(error)"
        }
    }

    /// The SHA-256 of a file, by an independent reader (coreutils' sha256sum), or nil where it is missing.
    func sha256(_ path: String) -> String? {
        let output = "/tmp/sdkhost-sha-\(getpid())"
        defer { unlink(output) }
        guard access("/usr/bin/sha256sum", X_OK) == 0, system("/usr/bin/sha256sum \(path) > \(output)") == 0,
              let text = readSmallFile(output) else { return nil }
        return String(text.prefix(64))
    }

    @Test func filesOthersMayWriteOrAnotherUserOwnsAreRefusedNamingTheFile() async throws {
        let temp = TemporaryExtension(identifier: "com.example.loose", executable: "Echo")
        defer { temp.remove() }
        let manifest = "\(temp.root)/Ext/Info.plist"
        var cases: [(setUp: () -> Void, expected: String)] = [
            ({ chmod(manifest, 0o666) }, "\(manifest) is writable by others (mode 666)"),
            ({ chmod(manifest, 0o644); chmod("\(temp.root)/Ext", 0o777) }, "\(temp.root)/Ext is writable by others (mode 777)"),
        ]
        if geteuid() == 0 {
            // A group other than root's and the host's may not write it either.
            cases.append(({ chmod("\(temp.root)/Ext", 0o755); chmod(manifest, 0o664); chown(manifest, 0, 4242) },
                          "\(manifest) is writable by its group 4242 (mode 664)"))
            cases.append(({ chmod(manifest, 0o644); chown(manifest, 65534, 65534) },
                          "\(manifest) is owned by uid 65534, neither root nor the host's uid 0"))
        }
        for (setUp, expected) in cases {
            setUp()
            try await withHost(extraSearchPaths: [temp.root]) { host, _ in
                let refused = await attempt(host, "com.example.loose")
                #expect(refused == "refused: com.example.loose: refused: \(expected)", "\(refused)")
                // The others are served all the same, and the refused one stays listed.
                #expect(await attempt(host, "com.example.echo") == "completed hello")
                #expect(host.extensions(forExtensionPoint: "com.sdk-host.service").contains { $0.identifier == "com.example.loose" })
            }
        }
        if geteuid() == 0 { chown(manifest, 0, 0) }
        chmod(manifest, 0o644)
        try await withHost(extraSearchPaths: [temp.root]) { host, _ in
            #expect(await attempt(host, "com.example.loose") == "completed hello", "the control: the same files, trusted")
        }
    }

    @Test func anExecutableOthersMayWriteIsRefused() async throws {
        let folder = try TemporaryFolder()
        chmod(folder.path, 0o755)
        let temp = TemporaryExtension(identifier: "com.example.copied", executable: "Echo")
        defer { temp.remove() }
        try SDKHost.writeFile("\(folder.path)/Echo", try readFile(try #require(HostConfiguration.executableDirectory.map { "\($0)/Echo" })), mode: 0o755)
        chmod("\(folder.path)/Echo", 0o757)
        try await withHost(extraSearchPaths: [temp.root], { $0.executableSearchPaths = [folder.path] }) { host, _ in
            let refused = await attempt(host, "com.example.copied")
            #expect(refused.contains("\(folder.path)/Echo is writable by others (mode 757)"), "\(refused)")
        }
        chmod("\(folder.path)/Echo", 0o755)
        try await withHost(extraSearchPaths: [temp.root], { $0.executableSearchPaths = [folder.path] }) { host, _ in
            #expect(await attempt(host, "com.example.copied") == "completed hello")
        }
    }

    /// A refused manifest that claims a served extension's identifier neither replaces it nor breaks the host.
    @Test func aRefusedManifestCannotTakeAnIdentifier() async throws {
        let temp = TemporaryExtension(identifier: "com.example.echo", executable: "Crasher")
        defer { temp.remove() }
        chmod("\(temp.root)/Ext/Info.plist", 0o646)
        try await withHost(extraSearchPaths: [temp.root]) { host, _ in
            #expect(await attempt(host, "com.example.echo") == "completed hello")
        }
    }

    @Test func executableSHA256IsCheckedOnWhatRuns() async throws {
        let echo = try #require(HostConfiguration.executableDirectory.map { "\($0)/Echo" })
        let digest = try #require(sha256(echo), "sha256sum is needed for this test")
        var wrong = Array(digest)
        wrong[0] = wrong[0] == "0" ? "1" : "0"
        let good = TemporaryExtension(identifier: "com.example.pinned", executable: "Echo",
                                      policy: "<key>ExecutableSHA256</key><string>\(digest.uppercased())</string>")
        let bad = TemporaryExtension(identifier: "com.example.mispinned", executable: "Echo",
                                     policy: "<key>ExecutableSHA256</key><string>\(String(wrong))</string>")
        defer { good.remove(); bad.remove() }
        try await withHost(extraSearchPaths: [good.root, bad.root]) { host, _ in
            #expect(await attempt(host, "com.example.pinned") == "completed hello")
            let refused = await attempt(host, "com.example.mispinned")
            #expect(refused.hasPrefix("interrupted(launch failed: ExecutableSHA256: /")
                && refused.hasSuffix("/Echo has SHA-256 \(digest), not the manifest's \(String(wrong)))"), "\(refused)")
            // The same under Sandbox none, where the operator allows it: the launcher still checks.
        }
        try await withHost(extraSearchPaths: [bad.root], {
            $0.allowedSandboxModes = [.none]
            $0.defaultPolicy.sandbox = .none
        }) { host, _ in
            #expect(await attempt(host, "com.example.mispinned").contains("launch failed: ExecutableSHA256"))
        }
        expectManifestErrors([("<key>ExecutableSHA256</key><string>abc</string>", "ExecutableSHA256: 'abc' is not 64 hex digits")],
                             executable: "Echo")
    }

    @Test func noManifestExceedsTheOperatorsCeilings() async throws {
        let allowed = try TemporaryFolder()
        let outside = try TemporaryFolder()
        mkdir("\(allowed.path)/data", 0o755)
        symlink(outside.path, "\(allowed.path)/link")
        defer { unlink("\(allowed.path)/link"); rmdir("\(allowed.path)/data") }
        let manifests: [(String, String, String)] = [
            ("none", "<key>Sandbox</key><string>none</string>",
             "Sandbox none is not in the operator's AllowedSandboxModes (strict)"),
            ("besteffort", "<key>Sandbox</key><string>bestEffort</string>",
             "Sandbox bestEffort is not in the operator's AllowedSandboxModes (strict)"),
            ("memory", "<key>MemoryLimitMB</key><integer>1024</integer>", "MemoryLimitMB 1024 is over the operator's MaxMemoryLimitMB 512"),
            ("network", "<key>NetworkAllowed</key><true/>", "NetworkAllowed is refused by the operator's AllowNetwork false"),
            ("readable", "<key>ReadablePaths</key><array><string>\(outside.path)</string></array>",
             "ReadablePaths '\(outside.path)' is outside the operator's AllowedReadableRoots"),
            ("symlink", "<key>ReadablePaths</key><array><string>\(allowed.path)/link</string></array>",
             "ReadablePaths '\(allowed.path)/link' is outside the operator's AllowedReadableRoots"),
            ("writable", "<key>WritablePaths</key><array><string>\(allowed.path)/data</string></array>",
             "WritablePaths '\(allowed.path)/data' is outside the operator's AllowedWritableRoots"),
            ("within", "<key>MemoryLimitMB</key><integer>512</integer><key>ReadablePaths</key><array><string>\(allowed.path)/data</string></array>", ""),
        ]
        let temps = manifests.map { TemporaryExtension(identifier: "com.example.\($0.0)", executable: "Echo", policy: $0.1) }
        defer { temps.forEach { $0.remove() } }
        try await withHost(extraSearchPaths: temps.map(\.root), {
            $0.allowedSandboxModes = [.strict]
            $0.maxMemoryLimitMB = 512
            $0.defaultPolicy.memoryLimitMB = 256
            $0.allowNetwork = false
            $0.allowedReadableRoots = [allowed.path]
            $0.allowedWritableRoots = ["\(outside.path)/nothing"]
        }) { host, _ in
            for (name, _, expected) in manifests {
                let result = await attempt(host, "com.example.\(name)")
                if expected.isEmpty {
                    #expect(result == "completed hello", "\(name): \(result)")
                } else {
                    #expect(result.hasPrefix("refused: com.example.\(name): refused: /tmp/") && result.hasSuffix("/Ext/Info.plist: \(expected)"),
                            "\(name): \(result)")
                }
            }
        }
    }
}
