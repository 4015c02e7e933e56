// Building an embedded host for the CLI (demo, request --embedded or without a daemon, bench): from the
// configuration file given with --config (or $SDKHOST_CONFIG) when there is one, else from the built-in defaults
// with the bundled extensions of the checkout around the running binary.
import SDKHost

#if canImport(Glibc)
import Glibc
#endif

enum EmbeddedHost {
    /// The configuration file embedded hosts use; set once by the command from its options (main thread).
    nonisolated(unsafe) private static var configurationFile: String?

    /// Takes `--config` (else $SDKHOST_CONFIG) as the configuration of every embedded host this command makes.
    static func configure(from options: Options) {
        configurationFile = options.value("--config") ?? getenv("SDKHOST_CONFIG").map { String(cString: $0) }
    }

    /// Extension search paths when no configuration names any: $SDKHOST_EXTENSIONS, ./Extensions, or the
    /// checkout around the running binary (.build/<config>/sdk-host or .build/<triple>/<config>/sdk-host).
    static func extensionSearchPaths() -> [String] {
        if let env = getenv("SDKHOST_EXTENSIONS") { return String(cString: env).split(separator: ":").map(String.init) }
        var candidates = ["Extensions"]
        if let dir = HostConfiguration.executableDirectory {
            candidates += ["\(dir)/../../Extensions", "\(dir)/../../../Extensions"]
        }
        return candidates.first { access("\($0)/Echo/Info.plist", R_OK) == 0 }.map { [$0] } ?? ["Extensions"]
    }

    /// The host configuration embedded hosts start from, and where it came from (for `request`'s report).
    static func baseConfiguration() -> (HostConfiguration, source: String) {
        guard let file = configurationFile else {
            return (HostConfiguration(extensionSearchPaths: extensionSearchPaths()), "built-in defaults")
        }
        do {
            let configuration = try readConfiguration(file)
            var host = configuration.host
            // The socket folder's crashes are the daemon's: an embedded host of the CLI (a request, a conformance
            // run, whose garbage makes workers exit 2 on purpose) keeps its reports in memory unless the file names
            // a folder. Before, they went into the daemon's, and `sdk-host crashes` listed them as the daemon's.
            if !configuration.namesCrashReportDirectory { host.crashReportDirectory = nil }
            return (host, file)
        } catch {
            fail("configuration error: \(error)", status: ExitStatus.usage)
        }
    }

    static func make(logLevel: LogLevel = .warning, tweak: (inout HostConfiguration) -> Void = { _ in }) -> ExtensionHost {
        var (configuration, _) = baseConfiguration()
        configuration.logLevel = logLevel
        // The CLI is an app that wants the host's warnings on its stderr (a library user chooses).
        configuration.logHandler = HostConfiguration.standardErrorLog
        tweak(&configuration)
        do {
            return try ExtensionHost(configuration: configuration)
        } catch {
            fail("cannot start the embedded host: \(error)", status: ExitStatus.usage)
        }
    }
}
