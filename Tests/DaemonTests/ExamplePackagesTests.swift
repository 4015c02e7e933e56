// The two example packages under Examples/, built as a user builds them: an extension package and an app
// package, each depending on sdk-host by path and using only its public products. The app embeds the host,
// greets through Greeter (whose greeting comes from the manifest's Environment key), and lets Snoop, an
// extension that knows nothing of the sandbox, try its escapes: every one must be refused under the default
// profile, the controls must work, and the host must still serve afterwards.
import HostTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct ExamplePackagesTests {
    /// `swift` from PATH, or the toolchain's usual place on this project's machines.
    static let swift: String? = {
        let path = environmentValue("PATH") ?? "/usr/bin:/bin"
        return (path.split(separator: ":").map { "\($0)/swift" } + ["/opt/swift/usr/bin/swift"])
            .first { access($0, X_OK) == 0 }
    }()

    @Test(.enabled(if: swift != nil, "needs the swift toolchain on PATH"), .timeLimit(.minutes(15)))
    func anAppAndAnExtensionFromOtherPackagesWorkAndTheExtensionStaysConfined() async throws {
        var template = "/tmp/sdkhost-examples-XXXXXX".utf8CString
        let folder = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        defer { removeFolder(folder) }
        let extensionPackage = "\(packageRoot)/Examples/GreeterExtension"
        // Builds go to the test's own folder (--scratch-path), not into the checkout or /tmp.
        for (package, scratch) in [(extensionPackage, "ext"), ("\(packageRoot)/Examples/GreeterApp", "app")] {
            let log = "\(folder)/\(scratch).log"
            // TMPDIR too: SwiftPM puts lock files named after the scratch path there.
            let pid = spawnProgram(["/usr/bin/env", "TMPDIR=\(folder)", Self.swift!, "build", "--package-path", package,
                                    "--scratch-path", "\(folder)/\(scratch)"], stdout: log, stderr: log)
            let status = await waitExit(pid, timeout: 900)
            #expect(status == 0, "swift build of \(package) failed:\n\(readSmallFile(log) ?? "")")
            guard status == 0 else { return }
        }
        let out = "\(folder)/app.out"
        let app = spawnProgram(["\(folder)/app/debug/greeter-app", extensionPackage, "--executables", "\(folder)/ext/debug",
                                "Ada", "Grace"], stdout: out, stderr: out)
        let status = await waitExit(app, timeout: 120)
        let text = readSmallFile(out) ?? ""
        #expect(status == 0, "\(text)")
        #expect(text.contains("greeter: Bonjour, Ada!") && text.contains("greeter: Bonjour, Grace!"), "\(text)")
        for attempt in ["shadow", "host-environ", "host-mem", "signal-host", "fork", "tcp:", "create:", "read:", "unix:",
                        "shared-memory"] {
            #expect(text.contains("snoop \(attempt)") && !text.contains("NOT STOPPED"), "\(attempt): \(text)")
        }
        #expect(text.contains("snoop tmpdir (control): ALLOWED"), "\(text)")
        #expect(text.contains("greeter: Bonjour, again!"), "\(text)")
    }
}
