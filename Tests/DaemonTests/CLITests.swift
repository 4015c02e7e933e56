// The CLI contract of shared/DESIGN.md: request exit statuses (0 completed, 3 cancelled, 4 interrupted, 2 usage
// or configuration error), and bad input as one clear line on stderr with a non-zero exit.
import HostTestSupport
import SDKHost
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

    @Test func requestExitStatuses() async throws {
        let (completed, out, _) = try await run(["request", "com.example.echo", "--embedded", "--text", "hi"])
        #expect(completed == 0)
        #expect(out.contains("completed") && out.contains("title=\"hi\""))
        #expect(try await run(["request", "com.example.crasher", "--embedded", "--text", "cancel"]).0 == 3)
        let (interrupted, text, _) = try await run(["request", "com.example.crasher", "--embedded", "--text", "segv"])
        #expect(interrupted == 4)
        #expect(text.contains("signal 11"))
        #expect(try await run(["request", "com.example.crasher", "--embedded", "--text", "hang", "--timeout", "0.3"]).0 == 4)
    }

    @Test func usageAndConfigurationErrorsExitTwoWithOneLine() async throws {
        let cases: [([String], String)] = [
            (["request", "com.example.nope", "--embedded"], "unknown extension 'com.example.nope'"),
            (["request", "com.example.echo", "--timeout", "soon"], "--timeout: 'soon' is not a positive number"),
            (["request"], "missing extension identifier"),
            (["request", "com.example.echo", "--bogus"], "unknown option --bogus"),
            (["frobnicate"], "unknown command 'frobnicate'"),
            (["serve", "--config", "/nonexistent/sdk-host.plist"], "/nonexistent/sdk-host.plist"),
        ]
        for (arguments, expected) in cases {
            let (status, _, err) = try await run(arguments)
            #expect(status == 2, "\(arguments)")
            #expect(err.hasPrefix("sdk-host: ") && err.contains(expected), "\(arguments): \(err)")
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

    @Test func statusWithoutADaemonSaysSo() async throws {
        let (status, _, err) = try await run(["status", "--socket", "/tmp/sdkhost-no-such-daemon.sock"])
        #expect(status == 1)
        #expect(err.contains("no daemon answering on /tmp/sdkhost-no-such-daemon.sock"))
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
}
