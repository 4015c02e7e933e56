// `sdk-host request <ext-id> [--text S]… [--embedded | --socket P] [--timeout S]`: one request, its outcome
// and items. Exit status: 0 completed, 3 cancelled, 4 interrupted, 2 usage or configuration error.
import Dispatch
import SDKHost
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

enum RequestCommand {
    static let usage = "usage: sdk-host request <extension-id> [--text S]... [--embedded | --socket PATH] [--timeout SECONDS]"

    static func run(_ arguments: [String]) {
        var identifier: String?
        var texts: [String] = []
        var timeout: Double?
        var socketPath: String?
        var i = 0
        while i < arguments.count {
            let arg = arguments[i]
            func value() -> String {
                guard i + 1 < arguments.count else { fail("\(arg) needs a value\n\(usage)", status: 2) }
                i += 1
                return arguments[i]
            }
            switch arg {
            case "--text": texts.append(value())
            case "--timeout":
                let raw = value()
                guard let t = Double(raw), t > 0 else { fail("--timeout: '\(raw)' is not a positive number of seconds", status: 2) }
                timeout = t
            case "--embedded": socketPath = nil
            case "--socket": socketPath = value()
            case let flag where flag.hasPrefix("-"): fail("unknown option \(flag)\n\(usage)", status: 2)
            default:
                guard identifier == nil else { fail("unexpected argument '\(arg)'\n\(usage)", status: 2) }
                identifier = arg
            }
            i += 1
        }
        guard let identifier else { fail("missing extension identifier\n\(usage)", status: 2) }
        if let socketPath {
            fail("--socket \(socketPath): daemon mode is not built yet; use --embedded", status: 2)
        }
        let host = EmbeddedHost.make()
        let ext: Extension
        do {
            ext = try host.extension(identifier: identifier)
        } catch {
            fail("\(error)", status: 2)
        }
        let items = texts.isEmpty ? [ExtensionItem()] : texts.map { ExtensionItem(title: $0) }
        let outcome = Mutex<RequestOutcome?>(nil)
        let done = DispatchSemaphore(value: 0)
        ext.requestCompletionHandler = { _, items in outcome.withLock { $0 = .completed(items) }; done.signal() }
        ext.requestCancellationHandler = { _, e in outcome.withLock { $0 = .cancelled(e) }; done.signal() }
        ext.requestInterruptionHandler = { _, r in outcome.withLock { $0 = .interrupted(r) }; done.signal() }
        let id = ext.beginRequest(withInputItems: items, deadline: timeout)
        done.wait()
        let finished = DispatchSemaphore(value: 0)
        host.shutdown { finished.signal() }
        finished.wait()
        switch outcome.withLock({ $0 })! {
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
