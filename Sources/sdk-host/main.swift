// sdk-host: the command-line entry point (shared/DESIGN.md "CLI"). Each subcommand lives in its own file.
#if canImport(Glibc)
import Glibc
#endif

let usage = """
    usage: sdk-host <command> [options]
      demo                      run echo, every crash fault and a cancel through an embedded host
      request <ext-id> [--text S]... [--embedded | --socket P] [--app NAME] [--timeout S]
                                one request; exit 0 completed, 3 cancelled, 4 interrupted, 2 usage error
      serve [--config P] [--socket P]
                                the daemon; SIGTERM/SIGINT drain in-flight requests, then stop
      status [--json]           the daemon's extensions, workers (with their sandbox layers) and counters
      doctor [--json]           which sandbox layers this machine offers, and why not
      crashes [--leaks] [--json] the crash (or leak) reports the daemon wrote
      plist encode              XML plist on stdin -> bplist00 on stdout
      plist decode              bplist00 on stdin -> XML plist on stdout
      bench [codec] [--json] [--quick]
                                performance figures next to the raw socketpair round trip (use -c release)
      bench --soak N [--json]   N requests with crashes, cancels and deadlines: RSS, descriptors, threads, slope
    """

/// Prints one line to stderr and exits with `status`: the CLI's error convention.
func fail(_ message: String, status: Int32 = 1) -> Never {
    var line = "sdk-host: " + message + "\n"
    line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
    exit(status)
}

var arguments = Array(CommandLine.arguments.dropFirst())
guard let command = arguments.first else { fail("missing command\n" + usage, status: 2) }
arguments.removeFirst()
switch command {
case "plist": PlistCommand.run(arguments)
case "bench": BenchCommand.run(arguments)
case "bench-peer": RawBench.peer()  // internal: the far end of the raw baseline
case "demo": DemoCommand.run(arguments)
case "request": RequestCommand.run(arguments)
case "serve": ServeCommand.run(arguments)
case "status": StatusCommand.run(arguments)
case "doctor": DoctorCommand.run(arguments)
case "crashes": CrashesCommand.run(arguments)
case "hammer": HammerCommand.run(arguments)  // internal: load client for tests
case "help", "--help", "-h": print(usage)
default: fail("unknown command '\(command)'\n" + usage, status: 2)
}
