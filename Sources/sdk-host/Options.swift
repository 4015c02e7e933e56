// Command-line options shared by the subcommands: flags with values (repeatable), boolean flags, positionals.
// Errors are usage errors (exit 2), one line on stderr.
import SDKDaemon
import SDKHost

#if canImport(Glibc)
import Glibc
#endif

struct Options {
    var values: [String: [String]] = [:]
    var flags: Set<String> = []
    var positionals: [String] = []

    init(_ arguments: [String], valued: Set<String>, boolean: Set<String>, usage: String) {
        var i = 0
        while i < arguments.count {
            let arg = arguments[i]
            if arg == "--help" || arg == "-h" {
                print(usage)
                exit(ExitStatus.success)
            }
            if valued.contains(arg) {
                guard i + 1 < arguments.count else { fail("\(arg) needs a value", status: ExitStatus.usage, usage: usage) }
                values[arg, default: []].append(arguments[i + 1])
                i += 2
                continue
            }
            if boolean.contains(arg) {
                flags.insert(arg)
            } else if arg.hasPrefix("-") {
                fail("unknown option \(arg)", status: ExitStatus.usage, usage: usage)
            } else {
                positionals.append(arg)
            }
            i += 1
        }
    }

    func value(_ flag: String) -> String? { values[flag]?.last }
    func has(_ flag: String) -> Bool { flags.contains(flag) }
}

/// Which configuration file the daemon-side commands read: --config P, else config/sdk-host.plist when present,
/// else $SDKHOST_CONFIG; nil for the defaults.
func configurationFile(_ options: Options) -> String? {
    if let path = options.value("--config") { return path }
    if access("config/sdk-host.plist", R_OK) == 0 { return "config/sdk-host.plist" }
    return getenv("SDKHOST_CONFIG").map { String(cString: $0) }
}

/// The daemon configuration: --config P, else config/sdk-host.plist when present, else $SDKHOST_CONFIG,
/// else defaults. A bad file is a usage/config error (exit 2) naming the key and the file.
func loadConfiguration(_ options: Options) -> DaemonConfiguration {
    var configuration: DaemonConfiguration
    do {
        configuration = try readConfiguration(configurationFile(options))
    } catch {
        fail("configuration error: \(error)", status: ExitStatus.usage)
    }
    if let socket = options.value("--socket") { configuration.socketPath = socket }
    return configuration
}

/// The configuration in `path`, or the defaults for nil; extension search paths default to the bundled ones.
func readConfiguration(_ path: String?) throws(HostError) -> DaemonConfiguration {
    guard let path else { return DaemonConfiguration(defaultExtensionSearchPaths: EmbeddedHost.extensionSearchPaths()) }
    return try DaemonConfiguration(contentsOf: path, defaultExtensionSearchPaths: EmbeddedHost.extensionSearchPaths())
}

/// Why the daemon on `socket` cannot be used, for one line of the CLI: "no daemon answering" when nothing is at
/// that path; otherwise what the client found there (a folder it does not trust, a socket nobody accepts on, a
/// daemon that refused it), which a user fixes differently.
func daemonUnreachable(_ socket: String, _ error: HostError) -> String {
    var st = stat()
    if lstat(socket, &st) != 0 && errno == ENOENT {
        return "no daemon answering on \(socket) (start one with `sdk-host serve`)"
    }
    // The detail may hold the daemon's own words (its refusal): shown escaped.
    let detail = error.detail.displaySafe()
    return detail.contains(socket) ? detail : "cannot use the daemon on \(socket): \(detail)"
}

/// Runs an async body from synchronous CLI code (the CLI's main thread may wait; library calls never do).
func runAsync<T: Sendable>(_ body: @escaping @Sendable () async -> T) -> T {
    let box = ResultBox<T>()
    let done = DispatchSemaphore(value: 0)
    Task {
        box.value = await body()
        done.signal()
    }
    done.wait()
    return box.value!
}

/// `@unchecked Sendable`: written once before the semaphore is signalled, read after the wait.
final class ResultBox<T>: @unchecked Sendable {
    var value: T?
}

import Dispatch
