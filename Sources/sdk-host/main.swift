// sdk-host: the command-line entry point (shared/DESIGN.md "CLI"). Each subcommand lives in its own file.
// Every command answers --help (exit 0) and shares one exit-status table (ExitStatus).
import SDKHost
import SDKPosix
import SDKWire

#if canImport(Glibc)
import Glibc
#endif

let usage = """
    usage: sdk-host <command> [options]        (sdk-host <command> --help for one command's options)
      demo [--config P]         echo, every crash fault, a deadline, a cancel, the sandbox escapes, a host
                                service, Python and C extensions and a quarantine, through an embedded host
      request <ext-id> [--text S]... [--payload JSON]... [--file FILE]... [--save DIR] [--serve NAME=PATH]...
              [--stream] [--embedded | --socket P] [--app NAME] [--timeout S] [--config P] [--log-level L]
                                one request; prints which host served it, the outcome and the items (and
                                with --stream each partial result as it comes); --payload sends a value a
                                Codable extension decodes, --file sends a file as a descriptor, --save
                                writes what comes back, --serve answers the extension's host calls from files
      serve [--config P] [--socket P]
                                the daemon; SIGTERM/SIGINT drain in-flight requests, then stop; SIGHUP rescans
                                manifests; systemd socket activation and sd_notify when started by systemd
      status [--json] [--socket P] [--config P]
                                the daemon's extensions, workers (with their sandbox layers) and counters
      doctor [--json] [--config P]
                                kernel features and sandbox layers, the configuration, the socket
      crashes [--leaks] [--json] [--config P] [--dir D]
                                the crash (or leak) reports the daemon wrote, each with its fatal-error line
      conformance <ext-id> [--config P]
                                the worker protocol's checks (docs/PROTOCOL.md) against one extension's worker,
                                under its sandbox: one line per check, then "N passed, N failed"
      plist encode|decode       XML plist on stdin -> bplist00 on stdout, and back
      bench [api|calls|codec|cold|daemon|drain|kill|languages|stream|throughput] [--json] [--quick] [--config P] [--peer P]
                                performance figures next to the raw socketpair round trip (use -c release)
      bench --soak N [--json]   N requests with crashes, cancels and deadlines: RSS, descriptors, threads, slope
      --version                 the version

    exit status (every command):
      0  success; for request: completed
      1  failure at run time: no daemon answering, no outcome in time, doctor found a layer missing, I/O error
      2  usage or configuration error: bad option or value, bad configuration key or manifest, unknown extension
      3  request cancelled (by the extension, or by the app)
      4  request interrupted: the worker crashed, stopped answering (hang) or broke the protocol, the request's
         deadline (--timeout) passed (timed out), the extension is quarantined, or the daemon went away

    environment:
      SDKHOST_CONFIG       configuration file when --config is not given and ./config/sdk-host.plist is absent
      SDKHOST_EXTENSIONS   extension search paths (colon-separated) when the configuration names none
      XDG_RUNTIME_DIR      the default socket is $XDG_RUNTIME_DIR/sdk-host/sdk-host.sock (else /tmp/sdk-host-<uid>/)
      TMPDIR               where workers' private temporary folders are made (default /tmp)
      LISTEN_FDS, LISTEN_PID, NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID, JOURNAL_STREAM
                           set by systemd for `serve`: socket activation, readiness, watchdog, journal log lines
    """

/// The exit statuses every command shares (printed in `usage`).
enum ExitStatus {
    static let success: Int32 = 0
    static let failure: Int32 = 1
    static let usage: Int32 = 2
    static let cancelled: Int32 = 3
    static let interrupted: Int32 = 4
}

/// The CLI's error convention: prints "sdk-host: <message>" on stderr, escaped (it may quote a peer), then
/// `usage` as it is (our own text, on its lines: it was escaped with the rest, one line of "\x0a"), and exits
/// with `status`.
func fail(_ message: String, status: Int32 = ExitStatus.failure, usage: String? = nil) -> Never {
    var line = "sdk-host: " + message.displaySafe() + "\n" + (usage.map { $0.hasSuffix("\n") ? $0 : $0 + "\n" } ?? "")
    // The host's log lines first (they are often why), then this one.
    LogWriter.standardError.flush(timeoutNanoseconds: 1_000_000_000)
    line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
    exit(status)
}

var arguments = Array(CommandLine.arguments.dropFirst())
guard let command = arguments.first else { fail("missing command", status: ExitStatus.usage, usage: usage) }
arguments.removeFirst()
switch command {
case "plist": PlistCommand.run(arguments)
case "bench": BenchCommand.run(arguments)
case "bench-peer": RawBench.peer(busyPoll: arguments.contains("--busy-poll"))  // internal: the far end of the raw baseline
case "demo": DemoCommand.run(arguments)
case "request": RequestCommand.run(arguments)
case "serve": ServeCommand.run(arguments)
case "status": StatusCommand.run(arguments)
case "doctor": DoctorCommand.run(arguments)
case "crashes": CrashesCommand.run(arguments)
case "conformance": ConformanceCommand.run(arguments)
case "hammer": HammerCommand.run(arguments)  // internal: load client for tests
case "help", "--help", "-h": print(usage)
case "version", "--version": print("sdk-host \(ExtensionHost.version)")
default: fail("unknown command '\(command)'", status: ExitStatus.usage, usage: usage)
}

/// Every line the CLI prints goes through here: what a peer wrote (a title, an error message, an app name, an
/// extension's fatal-error line) is shown with its control characters escaped, never interpreted by the terminal.
/// This shadows the standard library's `print` in this module, so that no call site can forget.
func print(_ items: Any..., separator: String = " ", terminator: String = "\n") {
    let text = items.map { "\($0)" }.joined(separator: separator)
    Swift.print(text.displaySafe(keepingNewlines: true), terminator: terminator)
}
