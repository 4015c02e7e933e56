// `sdk-host request <ext-id> [--text S]… [--embedded | --socket P] [--app NAME] [--timeout S]`: one request, its outcome
// and items. Exit status: 0 completed, 3 cancelled, 4 interrupted, 2 usage or configuration error.
// Without --socket or --embedded it uses the daemon when one answers on the configured socket, else embedded.
import Dispatch
import SDKHost

#if canImport(Glibc)
import Glibc
#endif

enum RequestCommand {
    static let usage = "usage: sdk-host request <extension-id> [--text S]... [--embedded | --socket PATH] [--app NAME] [--timeout SECONDS] [--config PATH]"

    static func run(_ arguments: [String]) -> Never {
        let options = Options(arguments, valued: ["--text", "--timeout", "--socket", "--config", "--app"], boolean: ["--embedded"], usage: usage)
        guard options.positionals.count == 1 else {
            fail(options.positionals.isEmpty ? "missing extension identifier\n\(usage)" : "unexpected argument '\(options.positionals[1])'\n\(usage)", status: 2)
        }
        let identifier = options.positionals[0]
        var timeout: Double?
        if let raw = options.value("--timeout") {
            guard let t = Double(raw), t > 0 else { fail("--timeout: '\(raw)' is not a positive number of seconds", status: 2) }
            timeout = t
        }
        if options.has("--embedded") && options.value("--socket") != nil {
            fail("--embedded and --socket exclude each other\n\(usage)", status: 2)
        }
        let host: ExtensionHost
        if options.has("--embedded") {
            host = EmbeddedHost.make()
        } else {
            let socket = loadConfiguration(options).socketPath
            let explicit = options.value("--socket") != nil
            // --app names this request's app to the daemon: apps get their own workers (WorkerSharing perApp).
            let app = options.value("--app")
            let connected: Result<ExtensionHost, HostError> = runAsync {
                do throws(HostError) {
                    return .success(try await ExtensionHost.connect(socketPath: socket, appName: app))
                } catch {
                    return .failure(error)
                }
            }
            switch connected {
            case .success(let h): host = h
            case .failure(let error) where explicit: fail("\(error)", status: 2)
            case .failure: host = EmbeddedHost.make()  // no daemon: embedded, as documented
            }
        }
        let ext: Extension
        do {
            ext = try host.extension(identifier: identifier)
        } catch {
            fail("\(error)", status: 2)
        }
        let texts = options.values["--text"] ?? []
        let items = texts.isEmpty ? [ExtensionItem()] : texts.map { ExtensionItem(title: $0) }
        let waiter = OutcomeWaiter(attachingTo: ext)
        let id = ext.beginRequest(withInputItems: items, deadline: timeout)
        let outcome = waiter.wait(for: id)
        let finished = DispatchSemaphore(value: 0)
        host.shutdown { finished.signal() }
        finished.wait()
        switch outcome! {
        case .completed(let items):
            print("completed \(id)")
            for (n, item) in items.enumerated() {
                print("  item \(n): title=\(item.title.map { "\"\($0)\"" } ?? "nil") attachments=\(PlistValue.array(item.attachments)) userInfo=\(PlistValue.dictionary(item.userInfo))")
            }
            exit(0)
        case .cancelled(let error):
            print("cancelled \(id): \(error)")
            exit(3)
        case .interrupted(let reason):
            print("interrupted \(id): \(reason)")
            exit(4)
        }
    }
}
