// The CLI contract of shared/DESIGN.md: request exit statuses (0 completed, 3 cancelled, 4 interrupted, 2 usage
// or configuration error), and bad input as one clear line on stderr with a non-zero exit.
import SDKWire
import HostTestSupport
import SDKHost
import SDKPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct CLITests {
    /// Runs sdk-host with `arguments`; returns its exit status, stdout and stderr.
    func run(_ arguments: [String], stdin: String? = nil, raw: Bool = false) async throws -> (Int32?, String, String) {
        var template = "/tmp/sdkhost-cli-XXXXXX".utf8CString
        let folder = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        defer { removeFolder(folder) }
        var command = raw ? arguments : [sdkHostBinary] + arguments
        if let stdin {
            writeFile("\(folder)/in", stdin)
            command = ["/bin/sh", "-c", "exec \"$0\" \"$@\" < '\(folder)/in'"] + command
        }
        let pid = spawnProgram(command, stdout: "\(folder)/out", stderr: "\(folder)/err")
        let status = await waitExit(pid)
        return (status, String(decoding: try readFile("\(folder)/out"), as: UTF8.self),
                String(decoding: try readFile("\(folder)/err"), as: UTF8.self))
    }

    /// Writes, in `folder` (made with its parent), the manifest of an extension `identifier` whose executable is
    /// Echo, with `policy` as its SDKHostPolicy's keys.
    func writeEchoManifest(in folder: String, identifier: String, policy: String = "") {
        mkdir(String(folder[..<(folder.lastIndex(of: "/") ?? folder.endIndex)]), 0o700)
        mkdir(folder, 0o700)
        writeFile("\(folder)/Info.plist", """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict>
              <key>CFBundleIdentifier</key><string>\(identifier)</string>
              <key>NSExtension</key><dict>
                <key>NSExtensionPointIdentifier</key><string>com.sdk-host.service</string>
                <key>NSExtensionExecutable</key><string>Echo</string>
                <key>SDKHostPolicy</key><dict>\(policy)</dict>
              </dict>
            </dict></plist>
            """)
    }

    /// sdk-host-simulate split over processes (one per job, each taking every J-th seed) reaches the same steps as
    /// one process running them all: the same trace digest and counts; a bad option is a usage error.
    @Test func theSimulationSplitOverProcessesReplaysTheSameSchedules() async throws {
        let simulate = sdkHostBinary.replacingLastPathComponent(with: "sdk-host-simulate")
        let (one, oneOut, oneErr) = try await run([simulate, "--schedules", "6", "--seed", "77", "--jobs", "1"], raw: true)
        let (three, threeOut, threeErr) = try await run([simulate, "--schedules", "6", "--seed", "77", "--jobs", "3"], raw: true)
        #expect(one == 0 && three == 0, "\(oneErr)\(threeErr)")
        func summary(_ out: String) -> [Substring] {
            out.split(separator: "\n").filter { !$0.contains("schedules/s") }
        }
        #expect(oneOut.hasSuffix("6 schedules, 0 violations\n"), "\(oneOut)")
        #expect(oneOut.contains("trace digest: 0x"), "\(oneOut)")
        #expect(summary(oneOut) == summary(threeOut), "one process:\n\(oneOut)\nthree:\n\(threeOut)")
        #expect(threeOut.contains("in 3 process(es)"), "\(threeOut)")
        let (bad, _, badErr) = try await run([simulate, "--schedules", "6", "--jobs", "0"], raw: true)
        #expect(bad == 2 && badErr.contains("--jobs: '0'"), "\(badErr)")
    }

    /// `request --serve NAME=PATH` answers the extension's host calls from files: a folder's file per call, or
    /// one file for every call; a path that is not there is a usage error before anything runs.
    @Test func requestServesAHostServiceFromFiles() async throws {
        let folder = try TemporaryFolder()
        try SDKHost.writeFile("\(folder.path)/name", Array("Ada".utf8), mode: 0o600)
        try SDKHost.writeFile("\(folder.path)/one", Array("X".utf8), mode: 0o600)
        let (status, out, err) = try await run(["request", "com.example.renderer", "--embedded", "--text", "Dear {{name}}!",
                                                "--serve", "document.part=\(folder.path)"])
        #expect(status == 0 && out.contains("text=\"Dear Ada!\""), "\(out)\(err)")
        let (same, sameOut, _) = try await run(["request", "com.example.renderer", "--embedded", "--text", "{{a}}{{b}}",
                                                "--serve", "document.part=\(folder.path)/one"])
        #expect(same == 0 && sameOut.contains("text=\"XX\""), "\(sameOut)")
        let (escape, escapeOut, _) = try await run(["request", "com.example.renderer", "--embedded", "--text", "{{../x}}",
                                                    "--serve", "document.part=\(folder.path)"])
        #expect(escape == 3 && escapeOut.contains("is not a file name"), "\(escapeOut)")
        let (missing, _, missingErr) = try await run(["request", "com.example.renderer", "--embedded", "--serve", "document.part=\(folder.path)/nope"])
        #expect(missing == 2 && missingErr.contains("\(folder.path)/nope"), "\(missingErr)")
        let (bad, _, badErr) = try await run(["request", "com.example.renderer", "--embedded", "--serve", "document.part"])
        #expect(bad == 2 && badErr.contains("is not NAME=PATH"), "\(badErr)")
        // A link in the folder is not followed out of it (before, /etc/hostname was served through one).
        symlink("\(folder.path)/one", "\(folder.path)/link")
        let (linked, linkedOut, _) = try await run(["request", "com.example.renderer", "--embedded", "--text", "{{link}}",
                                                    "--serve", "document.part=\(folder.path)"])
        #expect(linked == 3 && linkedOut.contains("a symbolic link"), "\(linkedOut)")
        // Neither a device (before, /dev/zero grew the CLI by gigabytes) nor a FIFO (before, the call waited on it).
        let (device, _, deviceErr) = try await run(["request", "com.example.renderer", "--embedded", "--serve", "document.part=/dev/zero"])
        #expect(device == 2 && deviceErr.contains("neither a regular file nor a folder"), "\(deviceErr)")
        mkfifo("\(folder.path)/fifo", 0o600)
        let (fifo, fifoOut, _) = try await run(["request", "com.example.renderer", "--embedded", "--text", "{{fifo}}",
                                                "--serve", "document.part=\(folder.path)"])
        #expect(fifo == 3 && fifoOut.contains("a FIFO"), "\(fifoOut)")
        // --file of a FIFO is refused at once; before, its open waited for a writer, past any --timeout.
        let (sent, _, sentErr) = try await run(["request", "com.example.echo", "--embedded", "--file", "\(folder.path)/fifo"])
        #expect(sent == 2 && sentErr.contains("a pipe, not a regular file"), "\(sentErr)")
    }

    @Test func requestAttachesSavesAndStreams() async throws {
        let folder = try TemporaryFolder()
        let bytes = (0..<(4 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
        try SDKHost.writeFile("\(folder.path)/big.bin", bytes, mode: 0o600)
        let (status, out, err) = try await run(["request", "com.example.echo", "--embedded", "--file", "\(folder.path)/big.bin",
                                                "--save", "\(folder.path)/out/"])
        #expect(status == 0, "\(out)\(err)")
        #expect(out.contains("files=[\(bytes.count) bytes]") && out.contains("saved \(folder.path)/out/item0-file0"), "\(out)")
        #expect(try readFile("\(folder.path)/out/item0-file0") == bytes)
        // Never overwrites: the same --save again says which file is in the way.
        let (again, _, againErr) = try await run(["request", "com.example.echo", "--embedded", "--attach", "\(folder.path)/big.bin",
                                                  "--save", "\(folder.path)/out"])
        #expect(again == 1 && againErr.contains("item0-file0") && againErr.contains("exists"), "\(againErr)")
        let (missing, _, missingErr) = try await run(["request", "com.example.echo", "--embedded", "--file", "\(folder.path)/nope"])
        #expect(missing == 2 && missingErr.contains("\(folder.path)/nope") && missingErr.contains("No such file"), "\(missingErr)")

        // --payload: a JSON value becomes the first item's payload, as ExtensionItem(encoding:) would send it.
        let (sent, echoed, _) = try await run(["request", "com.example.echo", "--embedded",
                                               "--payload", #"{"name": "Ada", "n": 3, "tags": ["x"], "pi": 3.5, "ok": true}"#])
        #expect(sent == 0 && echoed.contains(#"attachments=[{"n": 3, "name": "Ada", "ok": true, "pi": 3.5, "tags": ["x"]}]"#), "\(echoed)")
        // @FILE: JSON past the kernel's 128 KiB limit on one argument.
        writeFile("\(folder.path)/big.json", "{\"big\": \"\(String(repeating: "x", count: 200_000))\"}")
        let (fromFile, fileEchoed, _) = try await run(["request", "com.example.echo", "--embedded", "--payload", "@\(folder.path)/big.json"])
        #expect(fromFile == 0 && fileEchoed.contains(#"attachments=[{"big": "xxxx"#), "\(fileEchoed.prefix(300))")
        let (noFile, _, noFileErr) = try await run(["request", "com.example.echo", "--embedded", "--payload", "@\(folder.path)/none.json"])
        #expect(noFile == 2 && noFileErr.contains("--payload @\(folder.path)/none.json: open"), "\(noFileErr)")
        for (json, why) in [(#"{"a": null}"#, "null has no property-list form"), ("[1, 2", "an array is not closed at byte 5"),
                            (#"{"n": 18446744073709551615}"#, "'18446744073709551615' is a whole number outside the 64-bit range")] {
            let (bad, _, badErr) = try await run(["request", "com.example.echo", "--embedded", "--payload", json])
            #expect(bad == 2 && badErr.contains("--payload: \(why)"), "\(badErr)")
        }

        // --stream prints each partial result when it arrives: watched from outside, the first line is there
        // well before the fifth (the worker sends them 300 ms apart), not all at the end.
        let streamed = "\(folder.path)/stream.out"
        let pid = spawnProgram([sdkHostBinary, "request", "com.example.ticker", "--embedded", "--text", "5:300", "--stream"],
                               stdout: streamed, stderr: "\(folder.path)/stream.err")
        var firstSeen: UInt64?
        var fifthSeen: UInt64?
        _ = await eventually(timeout: 60) {
            let text = readSmallFile(streamed) ?? ""
            if firstSeen == nil, text.contains("tick 1/5") { firstSeen = monotonicNanoseconds() }
            if fifthSeen == nil, text.contains("tick 5/5") { fifthSeen = monotonicNanoseconds() }
            return fifthSeen != nil
        }
        #expect(await waitExit(pid) == 0)
        let gap = Double((fifthSeen ?? 0) &- (firstSeen ?? 0)) / 1e9
        #expect(firstSeen != nil && fifthSeen != nil && gap > 0.8, "first to fifth line: \(gap) s")
        let lines = (readSmallFile(streamed) ?? "").split(separator: "\n").filter { $0.hasPrefix("partial +") }
        #expect(lines.count == 5, "\(lines)")
    }

    /// The first thing a newcomer runs: every row shows its own fault's outcome (none is cut short by a
    /// quarantine), quarantine is a step of its own, and every request ends exactly once.
    @Test func theDemoShowsEveryFaultsOwnOutcomeAndQuarantineApart() async throws {
        let (status, out, err) = try await run(["demo"])
        #expect(status == 0, "\(out)\(err)")
        let rows = out.split(separator: "\n").map(String.init)
        func row(_ label: String) -> String { rows.first { $0.dropFirst(3).hasPrefix(label + " ") } ?? "no row '\(label)'" }
        let expected: [(String, String)] = [
            ("crasher segv", "interrupted  signal 11 (SIGSEGV)"), ("crasher abort", "interrupted  signal 6 (SIGABRT)"),
            ("crasher exit", "interrupted  exit 7"), ("crasher kill", "interrupted  signal 9 (SIGKILL)"),
            ("crasher garbage", "interrupted  protocol: bad frame"), ("crasher cancel", "cancelled"),
            ("crasher double", "completed    first"), ("crasher hang, 1 s deadline", "interrupted  timed out"),
            ("app cancels slow:5000", "cancelled"), ("echo again", "completed    still here"),
            ("crasher echo, quarantined", "interrupted  quarantined"),
            // A host service: the Renderer got the document's parts from the demo's app.
            ("renderer calls app twice", "completed    \"Dear Ada, see page 2\""),
            // Other languages: the Python echo, and each fault of the C Crasher with the Swift one's outcome.
            ("python echo", "completed    hello from Python"), ("python echo again", "completed    still here"),
            ("c crasher segv", "interrupted  signal 11 (SIGSEGV)"), ("c crasher abort", "interrupted  signal 6 (SIGABRT)"),
            ("c crasher exit", "interrupted  exit 7"), ("c crasher kill", "interrupted  signal 9 (SIGKILL)"),
            ("c crasher garbage", "interrupted  protocol: bad frame"), ("c crasher oversize", "interrupted  protocol: bad frame"),
            ("c crasher truncate", "interrupted  protocol: truncated frame"),
            ("c crasher unknownid", "interrupted  protocol: reply for unknown request"),
            ("c crasher cancel", "cancelled    com.example.crasher-c 42"), ("c crasher double", "completed    first"),
            ("c crasher hang, 1 s deadline", "interrupted  timed out"), ("app cancels c slow:5000", "cancelled"),
        ]
        for (label, outcome) in expected {
            #expect(row(label).contains(outcome), "\(label): \(row(label))")
        }
        // Quarantine shows only where the demo asks for it, with when it is tried again.
        #expect(rows.filter { $0.contains("quarantined") && !$0.contains("crasher echo, quarantined") }.count == 1, "\(out)")
        #expect(out.contains("com.example.crasher is quarantined: 3 crashes; it is tried again in"), "\(out)")
        #expect(row("c crasher range").contains("interrupted  signal 4 (SIGILL)") || row("c crasher range").contains("signal 5 (SIGTRAP)"),
                "\(row("c crasher range"))")
        #expect(out.contains("every one of 42 requests ended exactly once"), "\(out)")
    }

    /// `sdk-host conformance`: the examples on each runtime (Swift's Echo, the Python echo on sdkhost.py, the C
    /// Crasher on the C runtime) pass every check, one line each, and the summary last.
    @Test(arguments: ["com.example.echo", "com.example.echo-python", "com.example.crasher-c"])
    func conformancePassesForEachRuntime(_ identifier: String) async throws {
        let (status, out, err) = try await run(["conformance", identifier])
        #expect(status == 0, "\(out)\(err)")
        let lines = out.split(separator: "\n").map(String.init)
        for check in Self.conformanceChecks {
            #expect(lines.contains { $0.hasPrefix("pass  \(check) ") }, "\(check): \(out)")
        }
        #expect(lines.last == "11 passed, 0 failed", "\(out)")
        let (unknown, _, unknownErr) = try await run(["conformance", "com.example.nothing"])
        #expect(unknown == 2 && unknownErr.contains("unknown extension 'com.example.nothing'"), "\(unknownErr)")
    }

    /// The runtimes' own harnesses, which play the host over a socketpair with plistlib: every check passes. The
    /// C runtime also compiles as plain C11 with every warning an error, as an author's build would.
    @Test(.enabled(if: access("/usr/bin/python3", X_OK) == 0))
    func theLanguageRuntimesPassTheirHarnesses() async throws {
        let python = try await run(["/usr/bin/python3", "\(packageRoot)/Extensions/Python/test_runtime.py"], raw: true)
        #expect(python.0 == 0 && python.1.contains(" 0 failed"), "\(python.1)\(python.2)")
        let crasher = sdkHostBinary.replacingLastPathComponent(with: "CrasherC")
        let c = try await run(["/usr/bin/python3", "\(packageRoot)/Extensions/CrasherC/test_runtime.py", crasher], raw: true)
        #expect(c.0 == 0 && c.1.contains(" 0 failed"), "\(c.1)\(c.2)")
        let folder = try TemporaryFolder()
        let compiled = try await run(["/usr/bin/cc", "-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-O2", "-pthread",
                                      "-I", "\(packageRoot)/Extensions/CRuntime/include", "\(packageRoot)/Extensions/CrasherC/crasher.c",
                                      "\(packageRoot)/Extensions/CRuntime/sdkhost.c", "-o", "\(folder.path)/CrasherC"], raw: true)
        #expect(compiled.0 == 0, "\(compiled.1)\(compiled.2)")
        #expect(access("\(folder.path)/CrasherC", X_OK) == 0)
    }

    static let conformanceChecks = ["handshake", "echo", "heartbeat", "cancel", "partial results and credit", "descriptors",
                                    "host call", "unknown message", "malformed frame", "oversized frame", "idle exit"]

    /// A worker that never answers a cancel (written here on the raw protocol, under the strict sandbox) fails the
    /// cancel check, and the checks it does honour pass; the exit status says it failed.
    @Test(.enabled(if: HostConfiguration.defaultInterpreters["/usr/bin/python3"] != nil))
    func conformanceFailsTheRightCheckForAWorkerThatIgnoresCancel() async throws {
        let folder = try TemporaryFolder()
        writeRawPythonExtension(in: folder.path, name: "Deaf", identifier: "com.example.deaf", interpreter: "/usr/bin/python3",
                                loop: #"""
            while True:
                m = receive()
                if answered(m):
                    pass
                elif m["type"] == "begin" and m["items"][0].get("text") == "echo":
                    send({"type": "complete", "id": m["id"], "items": m["items"]})
                elif m["type"] == "begin" and m["items"][0].get("text") != "wait":
                    send({"type": "cancelled", "id": m["id"], "error": {"domain": "deaf", "code": 1, "message": "no"}})
                # "wait" and "cancel": nothing, ever
            """#)
        writeFile("\(folder.path)/config.plist", """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict>
              <key>ExtensionSearchPaths</key><array><string>\(folder.path)</string></array>
            </dict></plist>
            """)
        let (status, out, err) = try await run(["conformance", "com.example.deaf", "--config", "\(folder.path)/config.plist"])
        #expect(status == 1, "\(out)\(err)")
        let lines = out.split(separator: "\n").map(String.init)
        for check in ["handshake", "echo", "heartbeat", "unknown message", "idle exit"] {
            #expect(lines.contains { $0.hasPrefix("pass  \(check) ") }, "\(check): \(out)")
        }
        // It ignores cancel; it has no stream, files or calls; a bad frame makes it die of an uncaught exception
        // (exit 1), where the protocol asks for exit 2.
        for check in ["cancel", "partial results and credit", "descriptors", "host call", "malformed frame", "oversized frame"] {
            #expect(lines.contains { $0.hasPrefix("FAIL  \(check) ") }, "\(check): \(out)")
        }
        #expect(lines.contains { $0.hasPrefix("FAIL  cancel ") && $0.contains("did not answer the cancel") }, "\(out)")
        #expect(lines.contains { $0.hasPrefix("FAIL  malformed frame ") && $0.contains("exited with status 1") }, "\(out)")
        #expect(lines.last == "5 passed, 6 failed", "\(out)")
    }

    @Test func requestExitStatuses() async throws {
        let (completed, out, _) = try await run(["request", "com.example.echo", "--embedded", "--text", "hi"])
        #expect(completed == 0)
        #expect(out.contains("completed") && out.contains("title=\"hi\""))
        #expect(try await run(["request", "com.example.crasher", "--embedded", "--text", "cancel"]).0 == 3)
        let (interrupted, text, _) = try await run(["request", "com.example.crasher", "--embedded", "--text", "segv"])
        #expect(interrupted == 4)
        #expect(text.contains("signal 11"))
        let (ranged, rangeText, _) = try await run(["request", "com.example.crasher", "--embedded", "--text", "range"])
        #expect(ranged == 4 && rangeText.contains("  why: ") && rangeText.contains("Fatal error: Index out of range"), "\(rangeText)")
        #expect(try await run(["request", "com.example.crasher", "--embedded", "--text", "hang", "--timeout", "0.3"]).0 == 4)
        // --log-level shows the embedded host's log from that level (the workers' own lines are info).
        let (logged, _, logText) = try await run(["request", "com.example.echo", "--embedded", "--text", "hi", "--log-level", "info"])
        #expect(logged == 0 && logText.contains("info: com.example.echo: started launcher pid ")
                    && logText.contains("(its launcher's child), sandboxed"), "\(logText)")
        let (badLevel, _, badLevelText) = try await run(["request", "com.example.echo", "--embedded", "--log-level", "loud"])
        #expect(badLevel == 2 && badLevelText.contains("--log-level: 'loud' is not one of"), "\(badLevelText)")
    }

    /// Ctrl-C cancels the request, and its outcome is printed as any other (exit 3); before, it ended the command
    /// with no outcome (and through a daemon, the daemon logged the client as dropped).
    @Test func ctrlCCancelsTheRequest() async throws {
        let folder = try TemporaryFolder()
        let out = "\(folder.path)/out", err = "\(folder.path)/err"
        let pid = spawnProgram([sdkHostBinary, "request", "com.example.crasher", "--embedded", "--text", "slow:60000"],
                               stdout: out, stderr: err)
        // Its worker is running (so the request has begun, and Ctrl-C is the command's to handle).
        func children() -> [String] {
            (listNames("/proc/\(pid)/task") ?? []).flatMap { task in
                (readSmallFile("/proc/\(pid)/task/\(task)/children") ?? "").split(separator: " ").map(String.init)
            }
        }
        #expect(await eventually(timeout: 30) { !children().isEmpty })
        kill(pid, SIGINT)
        #expect(await waitExit(pid) == 3)
        let printed = String(decoding: try readFile(out), as: UTF8.self)
        #expect(printed.contains("cancelled ") && printed.contains("cancelled by the host"), "\(printed)")
        let said = String(decoding: try readFile(err), as: UTF8.self)
        #expect(said.contains("Ctrl-C: cancelling"), "\(said)")
    }

    @Test func everyCommandAnswersHelpAndTheVersion() async throws {
        for command in ["demo", "request", "serve", "status", "doctor", "crashes", "plist", "bench"] {
            let (status, out, err) = try await run([command, "--help"])
            #expect(status == 0, "\(command) --help: \(err)")
            #expect(out.hasPrefix("usage: sdk-host \(command)"), "\(command) --help printed \(out)")
        }
        let (status, out, _) = try await run(["--help"])
        #expect(status == 0 && out.contains("exit status (every command)") && out.contains("SDKHOST_CONFIG"))
        // The bench modes the main help lists are bench --help's.
        func modes(_ text: String, after marker: String) -> [String] {
            guard let start = text.range(of: marker)?.upperBound, let end = text[start...].firstIndex(of: "]") else { return [] }
            return text[start..<end].split(separator: "|").map { String($0.filter { $0 != " " }) }
        }
        let benchHelp = try await run(["bench", "--help"]).1
        #expect(modes(out, after: "bench [") == modes(benchHelp, after: "bench ["), "\(out)\n\(benchHelp)")
        #expect(modes(out, after: "bench [").contains("api"))
        let (versionStatus, version, _) = try await run(["--version"])
        #expect(versionStatus == 0 && version == "sdk-host \(ExtensionHost.version)\n")
    }

    @Test func embeddedRequestUsesTheConfigsExtensionPathsAndSaysWhichHost() async throws {
        // An extension that exists only in this configuration's search path (the Echo executable, renamed).
        let own = try TemporaryFolder()
        writeEchoManifest(in: "\(own.path)/exts/Only", identifier: "com.example.only-here")
        let config = "\(own.path)/sdk-host.plist"
        writeFile(config, """
            <plist version="1.0"><dict>
              <key>ExtensionSearchPaths</key><array><string>exts</string><string>\(packageRoot)/Extensions</string></array>
              <key>SocketPath</key><string>\(own.path)/none.sock</string>
            </dict></plist>
            """)
        let (status, out, err) = try await run(["request", "com.example.only-here", "--embedded", "--config", config, "--text", "x"])
        #expect(status == 0, "\(err)")
        #expect(out.contains("served by: embedded host (\(config)), worker pid "), "\(out)")
        let (unknown, _, unknownErr) = try await run(["request", "com.example.only-here", "--embedded"])
        #expect(unknown == 2 && unknownErr.contains("unknown extension"), "\(unknownErr)")
        // No daemon on the configured socket: embedded from the same configuration, said on stderr.
        let (fallback, fallbackOut, fallbackErr) = try await run(["request", "com.example.only-here", "--config", config])
        #expect(fallback == 0 && fallbackOut.contains("served by: embedded host"), "\(fallbackOut)")
        #expect(fallbackErr.contains("no daemon answering on \(own.path)/none.sock (start one with `sdk-host serve`); "
            + "using an embedded host"), "\(fallbackErr)")
        // The socket folder's crash reports are the daemon's: an embedded host keeps its own in memory (before,
        // they went there, and the suite's filled the user's own folder) unless the file names a folder.
        let (crashed, crashedOut, _) = try await run(["request", "com.example.crasher", "--embedded", "--config", config, "--text", "segv"])
        #expect(crashed == 4 && crashedOut.contains("signal 11"), "\(crashedOut)")
        #expect((listNames("\(own.path)/crashes") ?? []).isEmpty)
        let named = "\(own.path)/named.plist"
        writeFile(named, """
            <plist version="1.0"><dict>
              <key>ExtensionSearchPaths</key><array><string>\(packageRoot)/Extensions</string></array>
              <key>SocketPath</key><string>\(own.path)/none.sock</string>
              <key>CrashReportDirectory</key><string>\(own.path)/reports</string>
            </dict></plist>
            """)
        _ = try await run(["request", "com.example.crasher", "--embedded", "--config", named, "--text", "segv"])
        #expect((listNames("\(own.path)/reports") ?? []).contains { $0.hasSuffix(".crash.plist") })
    }

    /// An embedded `request` does not print another manifest's problem (it said "error:" about a manifest beside
    /// the one it served), but does when the extension it was asked for is not found: that manifest may have been
    /// this one's. That line used to be lost: the command exited before the log's writer thread wrote it.
    @Test func anEmbeddedRequestSaysASkippedManifestOnlyWhenItsExtensionIsNotFound() async throws {
        let own = try TemporaryFolder()
        writeEchoManifest(in: "\(own.path)/exts/Only", identifier: "com.example.only-here")
        mkdir("\(own.path)/exts/Broken", 0o700)
        writeFile("\(own.path)/exts/Broken/Info.plist", "<plist><dict><key>CFBundleIdentifier</key>\n")
        let config = "\(own.path)/sdk-host.plist"
        writeFile(config, """
            <plist version="1.0"><dict>
              <key>ExtensionSearchPaths</key><array><string>exts</string></array>
              <key>SocketPath</key><string>\(own.path)/none.sock</string>
            </dict></plist>
            """)
        let skipped = "\(own.path)/exts/Broken/Info.plist: line 2"
        let (served, _, servedErr) = try await run(["request", "com.example.only-here", "--embedded", "--config", config])
        #expect(served == 0 && !servedErr.contains("skipped"), "\(servedErr)")
        let (unknown, _, unknownErr) = try await run(["request", "com.example.broken", "--embedded", "--config", config])
        let lines = unknownErr.split(separator: "\n")
        #expect(unknown == 2 && lines.count == 2, "\(unknownErr)")
        #expect(lines.first?.contains(skipped) == true && lines.first?.hasSuffix("skipped, the other extensions are served") == true,
                "\(unknownErr)")
        #expect(lines.last?.contains("unknown extension 'com.example.broken'") == true, "\(unknownErr)")
        // --log-level asks for the whole log.
        let (logged, _, loggedErr) = try await run(["request", "com.example.only-here", "--embedded", "--config", config,
                                                    "--log-level", "warning"])
        #expect(logged == 0 && loggedErr.contains(skipped), "\(loggedErr)")
    }

    /// The log does not call an unconfined worker (Sandbox none) sandboxed.
    @Test func theLogSaysAnUnconfinedWorkerIsUnconfined() async throws {
        let own = try TemporaryFolder()
        writeEchoManifest(in: "\(own.path)/exts/Open", identifier: "com.example.open",
                          policy: "<key>Sandbox</key><string>none</string>")
        let config = "\(own.path)/sdk-host.plist"
        writeFile(config, """
            <plist version="1.0"><dict>
              <key>ExtensionSearchPaths</key><array><string>exts</string></array>
              <key>AllowedSandboxModes</key><array><string>strict</string><string>none</string></array>
              <key>SocketPath</key><string>\(own.path)/none.sock</string>
            </dict></plist>
            """)
        let (status, _, log) = try await run(["request", "com.example.open", "--embedded", "--config", config, "--log-level", "info"])
        #expect(status == 0 && log.contains("(its launcher's child), unconfined (Sandbox none)") && !log.contains("), sandboxed"),
                "\(log)")
    }

    /// A peer's text (a reply title, a client's message type) reaches neither the terminal nor the log with its
    /// control characters live: no escape sequence, no forged line.
    @Test func peerTextIsShownEscapedOnTheTerminalAndInTheLog() async throws {
        let hostile = "\u{1B}]0;owned\u{07}\u{1B}[2J\u{202E}txt\r\nsdk-host: error: forged"
        let (status, out, _) = try await run(["request", "com.example.echo", "--embedded", "--text", hostile])
        #expect(status == 0)
        #expect(!out.utf8.contains(0x1B) && !out.utf8.contains(0x07) && !out.utf8.contains(0x0D), "\(out)")
        #expect(out.contains("\\x1b]0;owned\\x07\\x1b[2J\\u{202e}txt\\x0d\\x0asdk-host: error: forged"), "\(out)")

        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let client = try HostileClient(daemon.socket)
        #expect(client.send(.unknown(type: hostile)) && client.isClosedByDaemon())
        #expect(await eventually(timeout: 20) { daemon.logText.contains("owned") }, "\(daemon.logText)")
        let log = daemon.logText
        #expect(!log.utf8.contains(0x1B) && !log.contains("\nsdk-host: error: forged"), "\(log)")
        #expect(await daemon.stop() == 0)
    }

    @Test func requestThroughTheDaemonSaysSoAndCrashesShowTheFatalErrorLine() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let (status, out, err) = try await run(["request", "com.example.crasher", "--config", daemon.configPath, "--text", "range"])
        #expect(status == 4, "\(err)")
        #expect(out.contains("served by: daemon pid \(daemon.pid) at \(daemon.socket), worker pid "), "\(out)")
        // Why the worker died, and the end of its stderr, from the daemon's crash report (as embedded, where they
        // come from the host's own): before, a request through the daemon showed neither.
        #expect(out.contains("  why: ") && out.contains("Fatal error: Index out of range")
                    && out.contains("the worker's stderr, last "), "\(out)")
        // status counts it by reason as "signal=1" ("signal 1" read as a signal's number).
        let (_, statusText, _) = try await run(["status", "--config", daemon.configPath])
        #expect(statusText.contains("com.example.crasher: interruptions by reason: signal=1"), "\(statusText)")
        #expect(await eventually(timeout: 20) { !CrashReportStore.load(directory: daemon.crashFolder).isEmpty })
        let (listed, crashes, _) = try await run(["crashes", "--config", daemon.configPath])
        #expect(listed == 0)
        #expect(crashes.contains("com.example.crasher") && crashes.contains("Fatal error: Index out of range"), "\(crashes)")
        // A report whose extension and reason hold control characters (a file put in the folder; an identifier
        // with a newline was once accepted) is shown escaped: it forges no line of the listing.
        var forged = try #require(CrashReportStore.load(directory: daemon.crashFolder).first)
        forged.extensionIdentifier = "evil\nsdk-host: error: FORGED"
        forged.reason = .protocolViolation("x\u{1b}[2J\rFORGED TOO")
        try writeFile("\(daemon.crashFolder)/00000000000000001-evil-1.crash.plist", BinaryPlistEncoder.encode(forged.plist))
        let (_, listing, _) = try await run(["crashes", "--config", daemon.configPath])
        #expect(listing.contains("evil\\x0asdk-host: error: FORGED"), "\(listing)")
        #expect(!listing.contains("\nsdk-host: error: FORGED") && !listing.utf8.contains(0x1B) && !listing.utf8.contains(0x0D), "\(listing)")
        #expect(await daemon.stop() == 0)
    }

    @Test func aDaemonClientSeesWorkerEventsAndExtensionPoints() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let host = try await ExtensionHost.connect(socketPath: daemon.socket)
        #expect(host.extensions.first { $0.identifier == "com.example.echo" }?.extensionPointIdentifier == "com.sdk-host.service")
        let events = host.workerEvents()
        // No wait needed: `subscribe` goes out on the client's loop before the request's `begin`.
        let task = try host.extension(identifier: "com.example.crasher").start([ExtensionItem(title: "kill")])
        #expect(await task.outcome == .interrupted(.signal(SIGKILL)))
        let seen = await eventsUntilExit(events)
        #expect(seen.map(\.kind) == [.spawned, .ready, .exited], "\(seen)")
        #expect(seen.last?.pid == task.pid && seen.last?.reason == .signal(SIGKILL))
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func aDaemonStartedByBenchDiesWithItsParentEvenOnSIGKILL() async throws {
        // bench starts its daemon with --exit-with-parent; a bench killed with SIGKILL left it behind before.
        let own = try TemporaryFolder()
        let shell = spawnProgram(["/bin/sh", "-c", "\"$0\" serve --socket '\(own.path)/d.sock' --exit-with-parent $$ 2>/dev/null & "
            + "echo $! > '\(own.path)/pid'; wait", sdkHostBinary])
        KillOnTermination.add(shell)
        defer { KillOnTermination.remove(shell) }
        #expect(await eventually(timeout: 30) { socketAccepts("\(own.path)/d.sock") })
        let daemon = try #require(readSmallFile("\(own.path)/pid").flatMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) })
        kill(shell, SIGKILL)
        _ = await waitExit(shell)
        // The daemon was reparented; it got SIGTERM, drained nothing and exited (signal 0 only probes).
        #expect(await eventually(timeout: 30) { kill(daemon, 0) != 0 || procStatFields("\(daemon)")?.first == "Z" })
    }

    @Test func usageAndConfigurationErrorsExitTwoWithOneLine() async throws {
        let cases: [([String], String)] = [
            (["request", "com.example.nope", "--embedded"], "unknown extension 'com.example.nope'"),
            (["request", "com.example.echo", "--timeout", "soon"], "--timeout: 'soon' is not a number of seconds"),
            (["request"], "missing extension identifier"),
            (["request", "com.example.echo", "--bogus"], "unknown option --bogus"),
            (["frobnicate"], "unknown command 'frobnicate'"),
            (["serve", "--config", "/nonexistent/sdk-host.plist"], "/nonexistent/sdk-host.plist"),
        ]
        for (arguments, expected) in cases {
            let (status, _, err) = try await run(arguments)
            #expect(status == 2, "\(arguments)")
            #expect(err.hasPrefix("sdk-host: ") && err.contains(expected), "\(arguments): \(err)")
            // The error on its line; a usage after it on lines of its own, as --help shows it (it was escaped with
            // the error into one line of "\x0a").
            #expect(!err.contains("\\x0a"), "\(arguments): \(err)")
            if err.contains("usage:") {
                #expect(err.split(separator: "\n").count > 2 && err.split(separator: "\n")[1].hasPrefix("usage: sdk-host"), "\(arguments): \(err)")
            }
        }
    }

    @Test func plistErrorsAreOneLineAndExitOne() async throws {
        let (status, _, err) = try await run(["plist", "decode"], stdin: "not a bplist")
        #expect(status == 1)
        #expect(err.contains("badMagic") && err.split(separator: "\n").count == 1, "\(err)")
        let (xmlStatus, _, xmlErr) = try await run(["plist", "encode"], stdin: "<plist><dict><key>a</key></dict></plist>")
        #expect(xmlStatus == 1)
        #expect(xmlErr.contains("line 1"), "\(xmlErr)")
        let (okStatus, xml, _) = try await run(["plist", "encode"], stdin: "<plist><integer>7</integer></plist>")
        #expect(okStatus == 0 && xml.hasPrefix("bplist00"))
    }

    /// `serve` refuses a socket folder that others may write, as every client does: it started and served from
    /// one, saying nothing, and every client refused it ("writable by others").
    @Test func serveRefusesASocketFolderOthersMayWrite() async throws {
        let folder = try TemporaryFolder()
        let open = "\(folder.path)/open"
        #expect(mkdir(open, 0o755) == 0 && chmod(open, 0o777) == 0)
        let pid = spawnProgram([sdkHostBinary, "serve", "--socket", "\(open)/d.sock"], stdout: "\(folder.path)/out",
                               stderr: "\(folder.path)/err")
        let status = await waitExit(pid, timeout: 30)
        if status == nil { kill(pid, SIGKILL); _ = await waitExit(pid) }  // it served: end it, by pid
        let err = readSmallFile("\(folder.path)/err") ?? ""
        #expect(status == 2, "\(err)")
        #expect(err.contains("socket folder \(open) is writable by others (mode 777)"), "\(err)")
        #expect(access("\(open)/d.sock", F_OK) != 0, "no socket was made")
    }

    /// The daemon raises its soft descriptor limit to the hard one, and keeps MaxUnreadDescriptorsPerClient within
    /// an eighth of it, saying so: past the soft limit the kernel refuses every descriptor its user sends, so one
    /// client that never reads would fail the others' descriptor passing.
    @Test func serveFitsTheUnreadDescriptorLimitToItsDescriptorLimit() async throws {
        let folder = try TemporaryFolder()
        let err = "\(folder.path)/err"
        // Hard 1024, soft 256: raised to 1024, and 2048 unread descriptors a client would be past it.
        let pid = spawnProgram(["/bin/sh", "-c", "ulimit -Sn 256 && ulimit -Hn 1024 && exec \"$0\" serve --socket \"$1\"",
                                sdkHostBinary, "\(folder.path)/d.sock"], stderr: err)
        let said = await eventually(timeout: 60) { (readSmallFile(err) ?? "").contains("serving") }
        let limits = readSmallFile("/proc/\(pid)/limits") ?? ""
        kill(pid, SIGTERM)
        #expect(await waitExit(pid) == 0)
        let log = readSmallFile(err) ?? ""
        #expect(said, "\(log)")
        #expect(log.contains("MaxUnreadDescriptorsPerClient 2048 lowered to 128"), "\(log)")
        let open = limits.split(separator: "\n").first { $0.hasPrefix("Max open files") }.map { $0.split(separator: " ", omittingEmptySubsequences: true) }
        #expect(open.map { Array($0.suffix(3)) } == ["1024", "1024", "files"], "\(limits)")
    }

    /// A second daemon on a live daemon's socket meets that at run time: exit 1, not the configuration error's 2.
    @Test func aSecondDaemonOnTheSameSocketIsARunTimeFailure() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let (status, _, err) = try await run(["serve", "--socket", daemon.socket])
        #expect(status == 1 && err.contains("another sdk-host daemon is already listening"), "\(String(describing: status)) \(err)")
        // A --socket path no socket can have is the operator's to fix, as the same SocketPath is.
        let folder = try TemporaryFolder()
        let (long, _, longErr) = try await run(["serve", "--socket", "\(folder.path)/" + String(repeating: "s", count: 120)])
        #expect(long == 2 && longErr.contains("a Unix socket's path holds at most 107"), "\(String(describing: long)) \(longErr)")
        #expect(await daemon.stop() == 0)
    }

    @Test func statusWithoutADaemonSaysSo() async throws {
        let (status, _, err) = try await run(["status", "--socket", "/tmp/sdkhost-no-such-daemon.sock"])
        #expect(status == 1)
        #expect(err.contains("no daemon answering on /tmp/sdkhost-no-such-daemon.sock"))
        // Something at the path that cannot be used is not "no daemon": the user is told what was found there.
        var template = "/tmp/sdkhost-cli-XXXXXX".utf8CString
        let folder = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        defer { _ = removeTree(folder) }
        let stale = try listenUnix(path: "\(folder)/stale.sock")
        stale.close()  // the socket file stays; nobody accepts on it
        let (staleStatus, _, staleErr) = try await run(["status", "--socket", "\(folder)/stale.sock"])
        #expect(staleStatus == 1 && staleErr.contains("cannot connect to \(folder)/stale.sock: Connection refused"), "\(staleErr)")
        #expect(!staleErr.contains("no daemon answering"), "\(staleErr)")
        chmod(folder, 0o777)
        let planted = try listenUnix(path: "\(folder)/planted.sock").release()
        let (plantedStatus, _, plantedErr) = try await run(["status", "--socket", "\(folder)/planted.sock"])
        close(planted)
        #expect(plantedStatus == 1 && plantedErr.contains("is writable by others (mode 777)"), "\(plantedErr)")
    }

    @Test func plistDecodeOfANaNDateIsAnErrorNotASignal() async throws {
        var template = "/tmp/sdkhost-cli-XXXXXX".utf8CString
        let folder = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        defer { removeFolder(folder) }
        let bytes = BinaryPlistEncoder.encode(["when": .date(PlistDate(secondsSinceReferenceDate: .nan))])
        let fd = open("\(folder)/nan.bplist", O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
        let (status, _, err) = try await run(["/bin/sh", "-c", "exec \"$0\" plist decode < '\(folder)/nan.bplist'", sdkHostBinary],
                                             raw: true)
        #expect(status == 1, "a clean error exit, not a signal (128+n)")
        #expect(err.contains("when") && err.contains("date"), "\(err)")
    }

    @Test func doctorNamesEveryLayer() async throws {
        let (status, out, _) = try await run(["doctor"])
        for layer in ["userNamespace", "pidNamespace", "mountNamespace", "netNamespace", "noNewPrivs", "capabilities",
                      "landlock", "seccomp", "rlimits"] {
            #expect(out.contains(layer), "\(layer) missing from: \(out)")
        }
        #expect(status == (out.contains("can launch workers here") ? 0 : 1))
        let (_, json, _) = try await run(["doctor", "--json"])
        #expect(json.contains("\"strictReady\":") && json.contains("\"name\":\"seccomp\""), "\(json)")
    }

    /// `doctor` exits 2 for a configuration that does not load, or a manifest the host skips (a second one of an
    /// identifier), as every command does; before, 1 for the first and "extensions ok" and 0 for the second.
    @Test func doctorReportsABadConfigurationAndASkippedManifest() async throws {
        let folder = try TemporaryFolder()
        writeFile("\(folder.path)/bad.plist", "<plist version=\"1.0\"><dict><key>MaxClients</key><string>x</string></dict></plist>")
        let (bad, badOut, _) = try await run(["doctor", "--config", "\(folder.path)/bad.plist"])
        #expect(bad == 2 && badOut.contains("MaxClients"), "\(String(describing: bad)) \(badOut)")
        for name in ["One", "Two"] {
            mkdir("\(folder.path)/\(name)", 0o755)
            writeFile("\(folder.path)/\(name)/Info.plist", String(decoding: try readFile("\(packageRoot)/Extensions/Echo/Info.plist"), as: UTF8.self))
        }
        writeFile("\(folder.path)/twice.plist", """
            <plist version="1.0"><dict><key>ExtensionSearchPaths</key><array><string>\(folder.path)</string></array>
            <key>SocketPath</key><string>\(folder.path)/d.sock</string></dict></plist>
            """)
        let (twice, twiceOut, _) = try await run(["doctor", "--config", "\(folder.path)/twice.plist"])
        #expect(twice == 2 && twiceOut.contains("is already used by"), "\(String(describing: twice)) \(twiceOut)")
        // An ill-formed manifest that names its identifier is said once (it was twice, on one line: refused by
        // name, then again as skipped).
        let bogusExtension = TemporaryExtension(identifier: "com.example.bogus", executable: "Echo",
                                                policy: "<key>Bogus</key><integer>0</integer>")
        defer { bogusExtension.remove() }
        writeFile("\(folder.path)/bogus.plist", """
            <plist version="1.0"><dict><key>ExtensionSearchPaths</key><array><string>\(bogusExtension.root)</string></array>
            <key>SocketPath</key><string>\(folder.path)/d.sock</string></dict></plist>
            """)
        let (bogus, bogusOut, _) = try await run(["doctor", "--config", "\(folder.path)/bogus.plist"])
        #expect(bogus == 2, "\(String(describing: bogus)) \(bogusOut)")
        #expect(bogusOut.components(separatedBy: "SDKHostPolicy.Bogus: unknown key").count == 2, "\(bogusOut)")
    }

    /// Copies the CLI, the launcher, Escaper and its manifest (plus `manifests`) into a folder any user can
    /// read, so that they can run as nobody wherever the checkout lives.
    func portableInstall(_ manifests: [String: String] = [:]) throws -> String {
        var template = "/tmp/sdkhost-install-XXXXXX".utf8CString
        let folder = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        chmod(folder, 0o755)
        let build = try #require(currentExecutableDirectory())
        for binary in ["sdk-host", "sdk-host-launcher", "Escaper"] {
            try writeFile("\(folder)/\(binary)", try readFile("\(build)/\(binary)"), mode: 0o755)
        }
        var all = manifests
        all["Escaper"] = String(decoding: try readFile("\(packageRoot)/Extensions/Escaper/Info.plist"), as: UTF8.self)
        mkdir("\(folder)/Extensions", 0o755)
        for (name, text) in all {
            mkdir("\(folder)/Extensions/\(name)", 0o755)
            writeFile("\(folder)/Extensions/\(name)/Info.plist", text)
            chmod("\(folder)/Extensions/\(name)/Info.plist", 0o644)
        }
        return folder
    }

    static let canSwitchUser = geteuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0

    @Test(.enabled(if: canSwitchUser, "needs root and setpriv"))
    func anUnprivilegedHostSandboxesItsWorkersToo() async throws {
        let subprocesses = """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict>
              <key>CFBundleIdentifier</key><string>com.example.escaper-children</string>
              <key>NSExtension</key><dict>
                <key>NSExtensionPointIdentifier</key><string>com.sdk-host.service</string>
                <key>NSExtensionExecutable</key><string>Escaper</string>
                <key>SDKHostPolicy</key><dict><key>AllowSubprocesses</key><true/></dict>
              </dict>
            </dict></plist>
            """
        let folder = try portableInstall(["Children": subprocesses])
        defer { removeFolder(folder) }
        func asNobody(_ id: String, _ attempt: String) async throws -> (Int32?, String) {
            let (status, out, err) = try await run(
                ["/usr/bin/env", "SDKHOST_EXTENSIONS=\(folder)/Extensions", "/usr/bin/setpriv", "--reuid=65534",
                 "--regid=65534", "--clear-groups", "\(folder)/sdk-host", "request", id, "--embedded", "--text", attempt,
                 "--timeout", "60"], raw: true)
            return (status, out + err)
        }
        let (status, layers) = try await asNobody("com.example.escaper", "layers")
        #expect(status == 0 && layers.contains("nnp 1") && layers.contains("seccomp 2") && layers.contains("capeff 0000000000000000"),
                "\(layers)")
        // procmem:1 and environ:1: pid 1 shares the launcher's memory and, here, the worker's uid.
        for attempt in ["fork", "read:/etc/shadow", "ptrace:1", "procmem:1", "environ:1", "mount:\(folder)", "tcp:9"] {
            let (_, out) = try await asNobody("com.example.escaper", attempt)
            #expect(out.contains("refused"), "\(attempt): \(out)")
        }
        // With AllowSubprocesses an unprivileged launcher needs a user namespace for the pid namespace: the
        // worker is pid 2 inside it, and may fork.
        let (_, inside) = try await asNobody("com.example.escaper-children", "layers")
        #expect(inside.contains("pid 2 ") && inside.contains("seccomp 2"), "\(inside)")
        let (_, fork) = try await asNobody("com.example.escaper-children", "fork")
        #expect(fork.contains("allowed: forked"), "\(fork)")
    }


    /// An install of the CLI with Escaper as strict (`com.example.escaper`) and bestEffort
    /// (`com.example.escaper-best-effort`), and a Python script there that installs the classic BPF `program` (a
    /// Python expression over `insn(code, k, jt, jf)`) as a seccomp filter and execs its arguments: a kernel without
    /// some sandbox layer, simulated for real. `request(id, attempt, asNobody)` runs `sdk-host request` under it.
    private func filteredInstall(_ name: String, program: String) throws
        -> (folder: String, request: (String, String, Bool) async throws -> (Int32?, String))
    {
        let bestEffort = """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict>
              <key>CFBundleIdentifier</key><string>com.example.escaper-best-effort</string>
              <key>NSExtension</key><dict>
                <key>NSExtensionPointIdentifier</key><string>com.sdk-host.service</string>
                <key>NSExtensionExecutable</key><string>Escaper</string>
                <key>SDKHostPolicy</key><dict><key>Sandbox</key><string>bestEffort</string></dict>
              </dict>
            </dict></plist>
            """
        let folder = try portableInstall(["BestEffort": bestEffort])
        let script = "\(folder)/\(name).py"
        writeFile(script, """
            import ctypes, os, struct, sys
            libc = ctypes.CDLL(None, use_errno=True)
            def insn(code, k, jt=0, jf=0): return struct.pack("HBBI", code, jt, jf, k)
            program = \(program)
            buffer = ctypes.create_string_buffer(program)
            class Program(ctypes.Structure): _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
            fprog = Program(len(program) // 8, ctypes.addressof(buffer))
            if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
                sys.exit("cannot install the filter")
            os.execv(sys.argv[1], sys.argv[1:])
            """)
        let python = try #require(python3)
        return (folder, { id, attempt, asNobody in
            let nobody = asNobody ? ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] : []
            let (status, out, err) = try await self.run(
                ["/usr/bin/env", "SDKHOST_EXTENSIONS=\(folder)/Extensions"] + nobody + [python, script, "\(folder)/sdk-host",
                 "request", id, "--embedded", "--text", attempt, "--timeout", "60"], raw: true)
            return (status, out + err)
        })
    }

    /// A kernel without Landlock: the filter answers landlock_create_ruleset with ENOSYS, as an old kernel does.
    @Test(.enabled(if: python3 != nil, "needs python3"))
    func strictRefusesToLaunchWithoutALayerAndBestEffortRunsWithoutIt() async throws {
        // ld nr; if nr == landlock_create_ruleset (444): return ENOSYS; else allow
        let (folder, request) = try filteredInstall("no-landlock", program:
            "insn(0x20, 0) + insn(0x15, 444, 0, 1) + insn(0x06, 0x00050000 | 38) + insn(0x06, 0x7fff0000)")
        defer { removeFolder(folder) }
        let (strictStatus, strict) = try await request("com.example.escaper", "layers", false)
        #expect(strictStatus == 4, "\(strict)")
        #expect(strict.contains("launch failed: sandbox: landlock unavailable: the kernel has no Landlock"), "\(strict)")
        // bestEffort runs with the rest (seccomp still answers). A file outside the grants stays out of reach
        // without Landlock: the worker's root does not hold it.
        let (status, layers) = try await request("com.example.escaper-best-effort", "layers", false)
        #expect(status == 0 && layers.contains("seccomp 2"), "\(layers)")
        let (_, fork) = try await request("com.example.escaper-best-effort", "fork", false)
        #expect(fork.contains("refused"), "\(fork)")
        let (_, shadow) = try await request("com.example.escaper-best-effort", "read:\(folder)/no-landlock.py", false)
        #expect(shadow.contains("refused: errno 2"), "without Landlock the new root still holds only grants: \(shadow)")
        // An unprivileged host's worker has the launcher's uid, and pid 1 shares the launcher's memory: without
        // Landlock's ptrace scoping, what keeps the worker out of it is pid 1's capabilities in their user namespace
        // (the worker has none) and that memory being undumpable.
        if geteuid() == 0 {
            for attempt in ["procmem:1", "environ:1"] {
                let (_, out) = try await request("com.example.escaper-best-effort", attempt, true)
                #expect(out.contains("refused: errno 13"), "\(attempt): \(out)")
            }
        }
    }

    /// A kernel that makes no namespaces: the filter answers a clone with CLONE_NEWUSER with EPERM. Strict refuses
    /// to launch; bestEffort runs without them, and a root host's worker still never runs as root (its TMPDIR, the
    /// host's folder, is its own to write).
    @Test(.enabled(if: python3 != nil, "needs python3"))
    func withoutNamespacesStrictRefusesAndBestEffortNeverRunsAsRoot() async throws {
        // ld nr; if nr == clone (56): ld flags; if flags & CLONE_NEWUSER: return EPERM; allow
        let (folder, request) = try filteredInstall("no-namespaces", program:
            "insn(0x20, 0) + insn(0x15, 56, 0, 3) + insn(0x20, 16) + insn(0x45, 0x10000000, 0, 1)"
            + " + insn(0x06, 0x00050000 | 1) + insn(0x06, 0x7fff0000)")
        defer { removeFolder(folder) }
        let tmpdir = try await expectStrictRefusesAndBestEffortRuns(request, refusal: "launch failed: sandbox: namespaces unavailable")
        #expect(tmpdir.contains("allowed: wrote"), "\(tmpdir)")
        let (_, fork) = try await request("com.example.escaper-best-effort", "fork", false)
        #expect(fork.contains("refused"), "\(fork)")
    }

    /// A kernel that makes the namespaces but refuses the new root (the filter answers pivot_root with EPERM).
    /// Strict refuses to launch; bestEffort runs in its namespaces without a root of its own, and what was mounted
    /// for that root is gone: its TMPDIR, the host's folder (a root host's made WorkerUser's), is there and its own.
    @Test(.enabled(if: python3 != nil, "needs python3"))
    func withoutARootBestEffortStillHasItsTemporaryFolder() async throws {
        #if arch(x86_64)
        let pivotRoot = 155
        #else
        let pivotRoot = 41
        #endif
        // ld nr; if nr == pivot_root: return EPERM; else allow
        let (folder, request) = try filteredInstall("no-pivot", program:
            "insn(0x20, 0) + insn(0x15, \(pivotRoot), 0, 1) + insn(0x06, 0x00050000 | 1) + insn(0x06, 0x7fff0000)")
        defer { removeFolder(folder) }
        let tmpdir = try await expectStrictRefusesAndBestEffortRuns(
            request, refusal: "launch failed: sandbox: root unavailable: pivot_root refused")
        #expect(tmpdir.contains("allowed: wrote") && tmpdir.contains("sdk-host-worker."), "\(tmpdir)")
    }

    /// Under a filter that takes a layer away: strict refuses to launch, saying `refusal`; bestEffort runs as the
    /// worker's uid (never root) under seccomp. Returns what bestEffort's worker said of writing its TMPDIR.
    private func expectStrictRefusesAndBestEffortRuns(
        _ request: (String, String, Bool) async throws -> (Int32?, String), refusal: String,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> String {
        let (strictStatus, strict) = try await request("com.example.escaper", "layers", false)
        #expect(strictStatus == 4, "\(strict)", sourceLocation: sourceLocation)
        #expect(strict.contains(refusal), "\(strict)", sourceLocation: sourceLocation)
        let (status, layers) = try await request("com.example.escaper-best-effort", "layers", false)
        let worker = geteuid() == 0 ? 65534 : getuid()
        #expect(status == 0 && layers.contains("uid \(worker) ") && layers.contains("seccomp 2"), "\(layers)",
                sourceLocation: sourceLocation)
        return try await request("com.example.escaper-best-effort", "tmpdir", false).1
    }
}

extension String {
    /// The path with its last component replaced.
    fileprivate func replacingLastPathComponent(with name: String) -> String {
        guard let slash = lastIndex(of: "/") else { return name }
        return String(self[...slash]) + name
    }
}
