// `sdk-host serve [--config P] [--socket P]`: the daemon. SIGTERM/SIGINT drain in-flight requests, then stop the
// workers, remove the socket and exit 0.
import SDKDaemon
import SDKHost

#if canImport(Glibc)
import Glibc
#endif

enum ServeCommand {
    static let usage = "usage: sdk-host serve [--config PATH] [--socket PATH]"

    static func run(_ arguments: [String]) -> Never {
        let options = Options(arguments, valued: ["--config", "--socket"], boolean: [], usage: usage)
        guard options.positionals.isEmpty else { fail("unexpected argument '\(options.positionals[0])'\n\(usage)", status: 2) }
        let configuration = loadConfiguration(options)
        let server: DaemonServer
        do {
            server = try DaemonServer(configuration: configuration)
        } catch {
            fail("serve: \(error)", status: 2)
        }
        exit(server.run())
    }
}
