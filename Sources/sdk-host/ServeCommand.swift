// `sdk-host serve [--config P] [--socket P]`: the daemon. SIGTERM/SIGINT drain in-flight requests, then stop the
// workers, remove the socket and exit 0.
import SDKDaemon
import SDKHost
import SDKPosix

#if canImport(Glibc)
import Glibc
#endif

enum ServeCommand {
    static let usage = """
        usage: sdk-host serve [--config PATH] [--socket PATH]
          The daemon. SIGTERM/SIGINT: stop accepting, drain in-flight requests (DrainTimeoutSeconds), stop workers.
          SIGHUP: rescan the manifests; new workers use the new ones, running workers finish and retire.
          Under systemd (config/sdk-host.service and .socket): the listening socket as fd 3 (LISTEN_FDS), READY=1,
          STATUS=, RELOADING=1 and STOPPING=1 to $NOTIFY_SOCKET, WATCHDOG=1 pings when $WATCHDOG_USEC is set, and
          `<N>`-prefixed log lines when $JOURNAL_STREAM names stderr.
          --config PATH   the configuration (default ./config/sdk-host.plist, else $SDKHOST_CONFIG, else defaults)
          --socket PATH   the socket, overriding the configuration's SocketPath
        """

    static func run(_ arguments: [String]) -> Never {
        let options = Options(arguments, valued: ["--config", "--socket", "--exit-with-parent"], boolean: [], usage: usage)
        guard options.positionals.isEmpty else { fail("unexpected argument '\(options.positionals[0])'", status: ExitStatus.usage, usage: usage) }
        // Internal (bench): end with the process that started us, even if it is SIGKILLed.
        if let raw = options.value("--exit-with-parent") {
            guard let parent = Int32(raw) else { fail("--exit-with-parent: '\(raw)' is not a pid", status: ExitStatus.usage) }
            try? setParentDeathSignal(SIGTERM)
            if getppid() != parent { exit(ExitStatus.failure) }  // it is already gone
        }
        let configuration = loadConfiguration(options)
        let server: DaemonServer
        do {
            server = try DaemonServer(configuration: configuration)
        } catch {
            // A bad configuration or path is the operator's to fix (2); a daemon already there, or a socket that
            // cannot be made, is what serving met at run time (1).
            fail("serve: \(error)", status: error.code == .system ? ExitStatus.failure : ExitStatus.usage)
        }
        exit(server.run())
    }
}
