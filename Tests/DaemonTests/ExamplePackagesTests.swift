// The two example packages under Examples/, built as a user builds them: an extension package and an app
// package, each depending on sdk-host by path and using only its public products. The app embeds the host,
// greets through Greeter (whose greeting comes from the manifest's Environment key), and lets Snoop, an
// extension that knows nothing of the sandbox, try its escapes: every one must be refused under the default
// profile, the controls must work, and the host must still serve afterwards. Then the extension package's own
// tests run (they use SDKExtensionTesting), and a daemon serving its manifests reports its two leaky
// extensions, and not the clean one.
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
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
        // Builds go to the test's own folder (--scratch-path), not into the checkout or /tmp. Both packages share
        // one scratch folder, so sdk-host's modules are compiled once (the app's build reuses the extension's).
        for (package, name) in [(extensionPackage, "ext"), ("\(packageRoot)/Examples/GreeterApp", "app")] {
            let log = "\(folder)/\(name).log"
            // TMPDIR too: SwiftPM puts lock files named after the scratch path there.
            let pid = spawnProgram(["/usr/bin/env", "TMPDIR=\(folder)", Self.swift!, "build", "--package-path", package,
                                    "--scratch-path", "\(folder)/build"], stdout: log, stderr: log)
            let status = await waitExit(pid, timeout: 900)
            #expect(status == 0, "swift build of \(package) failed:\n\(readSmallFile(log) ?? "")")
            guard status == 0 else { return }
        }
        let out = "\(folder)/app.out"
        let app = spawnProgram(["\(folder)/build/debug/greeter-app", extensionPackage, "--executables", "\(folder)/build/debug",
                                "Ada", "Grace"], stdout: out, stderr: out)
        let status = await waitExit(app, timeout: 120)
        let text = readSmallFile(out) ?? ""
        #expect(status == 0, "\(text)")
        #expect(text.contains("greeter: Bonjour, Ada!") && text.contains("greeter: Bonjour, Grace!"), "\(text)")
        // Host services: the extension package's Greeter asks the app package for nicknames.
        #expect(text.contains("greeter via service: Bonjour, Countess Ada!") && text.contains("greeter via service: Bonjour, Amazing Grace!"),
                "\(text)")
        #expect(text.contains("greeter stream: 1\ngreeter stream: cancelled after 1 result"), "\(text)")
        // The app set no logHandler: the host writes nothing to the app's stderr, however its workers ended.
        #expect(!text.contains("sdk-host"), "\(text)")
        for attempt in ["shadow", "host-environ", "host-mem", "signal-host", "fork", "tcp:", "create:", "read:", "unix:",
                        "shared-memory"] {
            #expect(text.contains("snoop \(attempt)") && !text.contains("NOT STOPPED"), "\(attempt): \(text)")
        }
        #expect(text.contains("snoop tmpdir (control): ALLOWED"), "\(text)")
        #expect(text.contains("greeter: Bonjour, again!"), "\(text)")

        // The extension package's own tests depend on SDKExtensionTesting: the handler in process, and a
        // retain cycle among its helpers caught.
        let testLog = "\(folder)/ext-test.log"
        let tests = spawnProgram(["/usr/bin/env", "TMPDIR=\(folder)", Self.swift!, "test", "--package-path", extensionPackage,
                                  "--scratch-path", "\(folder)/build"], stdout: testLog, stderr: testLog)
        let testStatus = await waitExit(tests, timeout: 900)
        let testText = readSmallFile(testLog) ?? ""
        #expect(testStatus == 0, "\(testText)")
        #expect(testText.contains("caught: 2 of 2 object(s) still alive: root (CyclicGreeter), root.partner (CyclicGreeter)"),
                "\(testText)")

        // Through a daemon: the package's leaky extensions are reported within seconds, the clean one is not.
        let daemon = try await DaemonProcess(extraConfig: """
            <key>ExecutableSearchPaths</key><array>
              <string>\(currentExecutableDirectory() ?? ".")</string><string>\(folder)/build/debug</string>
            </array>
            """, extraSearchPaths: ["\(extensionPackage)/Manifests"])
        defer { daemon.remove() }
        // The app package again, its Greeter calls now through the daemon: each goes back to this app's connection.
        let viaDaemon = "\(folder)/app-daemon.out"
        let appThroughDaemon = spawnProgram(["\(folder)/build/debug/greeter-app", extensionPackage, "--executables", "\(folder)/build/debug",
                                            "--daemon", daemon.socket, "Ada"], stdout: viaDaemon, stderr: viaDaemon)
        let daemonAppStatus = await waitExit(appThroughDaemon, timeout: 120)
        let daemonAppText = readSmallFile(viaDaemon) ?? ""
        #expect(daemonAppStatus == 0, "\(daemonAppText)")
        #expect(daemonAppText.contains("greeter via service through the daemon: Bonjour, Countess Ada!"), "\(daemonAppText)")
        for ext in ["com.example.hoarder", "com.example.watcher", "com.example.greeter"] {
            let request = spawnProgram([sdkHostBinary, "request", ext, "--socket", daemon.socket, "--text", "x"])
            #expect(await waitExit(request) == 0, "\(ext)")
        }
        func leaks(_ status: HostStatus, _ id: String) -> Int { status[id]?.leaks ?? -1 }
        var report = try await HostStatus.read(daemon)
        let reported = await eventually(timeout: 20) {
            guard let now = try? await HostStatus.read(daemon) else { return false }
            report = now
            return leaks(now, "com.example.hoarder") >= 1 && leaks(now, "com.example.watcher") >= 1
        }
        #expect(reported, "\(report.extensions.map { ($0.identifier, $0.leaks) })")
        #expect(leaks(report, "com.example.greeter") == 0)
        #expect(daemon.logText.contains("com.example.hoarder pid") && daemon.logText.contains(": leak: request"),
                "\(daemon.logText)")
        // ... and wrote leak reports beside its crash reports.
        let leakList = "\(folder)/leaks.txt"
        let crashes = spawnProgram([sdkHostBinary, "crashes", "--leaks", "--dir", daemon.crashFolder], stdout: leakList)
        #expect(await waitExit(crashes) == 0)
        let leakText = readSmallFile(leakList) ?? ""
        #expect(leakText.contains("com.example.hoarder") && leakText.contains("com.example.watcher")
                && leakText.contains("context alive"), "\(leakText)")
        #expect(await daemon.stop() == 0)
    }
}
