// `sdk-host status [--json] [--socket P] [--config P]`: the daemon's extensions, workers and counters.
import SDKHost

#if canImport(Glibc)
import Glibc
#endif

enum StatusCommand {
    static let usage = """
        usage: sdk-host status [--json] [--socket PATH] [--config PATH]
          The daemon's extensions (state, requests and their outcomes, latency, slow requests, crashes), its pools
          in quarantine, and its workers with their sandbox layers. A uid other than root and the daemon's sees
          only its own apps' workers.
          --json          every field as JSON
          --socket PATH   the daemon's socket (default: the configuration's SocketPath)
          --config PATH   the configuration to read the socket from
        """

    static func run(_ arguments: [String]) -> Never {
        let options = Options(arguments, valued: ["--config", "--socket"], boolean: ["--json"], usage: usage)
        let socket = loadConfiguration(options).socketPath
        let answer: Result<PlistValue?, HostError> = runAsync {
            let host: ExtensionHost
            do throws(HostError) {
                host = try await ExtensionHost.connect(socketPath: socket, reconnectTimeout: 2)
            } catch {
                return .failure(error)
            }
            let report = await host.daemonStatus()
            await host.shutdown()
            return .success(report)
        }
        let report: PlistValue
        switch answer {
        case .success(let r?): report = r
        case .success(nil): fail("status: the daemon on \(socket) closed the connection before it answered", status: 1)
        case .failure(let error): fail("status: \(daemonUnreachable(socket, error))", status: 1)
        }
        if options.has("--json") {
            print(JSON.render(report))
            exit(0)
        }
        let status: HostStatus
        do {
            status = try HostStatus(plist: report)
        } catch {
            fail("status: the daemon's report does not read as a status: \(error)", status: 1)
        }
        print("daemon pid \(status.pid), up \(Int(status.uptimeSeconds)) s, socket \(socket), "
            + "\(status.activeRequests) request(s) active, \(status.queuedRequests) queued")
        // Each column as wide as its widest cell.
        let header = ["extension", "state", "req", "done", "cancel", "intr", "p50 ms", "p99 ms", "slow", "/1000", "crash", "workers"]
        let rows = status.extensions.map { ext -> [String] in
            var state = ext.problem == nil ? ext.state.rawValue : "refused"
            if let retry = ext.retryInSeconds { state += " \(Int(retry.rounded(.up)))s" }
            return [ext.identifier, state, String(ext.requests), String(ext.completions), String(ext.cancellations),
                    String(ext.interruptions), ext.latencyP50Milliseconds.map { format($0) } ?? "-",
                    ext.latencyP99Milliseconds.map { format($0) } ?? "-", String(ext.slowRequests), format(ext.slowRequestsPer1000),
                    String(ext.crashes), String(ext.workers.count)]
        }
        let widths = header.indices.map { column in ([header] + rows).map { $0[column].count }.max() ?? 0 }
        for cells in [header] + rows {
            print(cells.enumerated().map { $0.offset == cells.count - 1 ? $0.element : pad($0.element, widths[$0.offset] + 2) }.joined())
        }
        for ext in status.extensions {
            if let problem = ext.problem { print("\(ext.identifier): refused, no request can start: " + problem.displaySafe()) }
            if !ext.interruptionsByReason.isEmpty {
                // "signal=4", not "signal 4", which read as SIGILL: four requests interrupted by a signal.
                print("\(ext.identifier): interruptions by reason: " + ext.interruptionsByReason.keys.sorted()
                    .map { "\($0)=\(ext.interruptionsByReason[$0]!)" }.joined(separator: ", "))
            }
            if ext.leaks > 0 { print("\(ext.identifier): \(ext.leaks) leak(s) (contexts or Tasks alive after their request)") }
            if ext.slowRequests > 0 {
                print("\(ext.identifier): \(ext.slowRequests) slow request(s) (over its SlowRequestThresholdMilliseconds), "
                    + "\(format(ext.slowRequestSeconds)) s over it in all")
            }
            for pool in ext.pools where pool.state != .running || pool.crashCount > 0 {
                var line = ext.identifier + (pool.app.map { " (app \($0))" } ?? "")
                line += ": \(pool.state.rawValue), \(pool.crashCount) recent crash(es)"
                if let retry = pool.retryInSeconds { line += ", retries in \(format(retry)) s" }
                if pool.backoffSeconds > 0 { line += ", backoff \(format(pool.backoffSeconds)) s" }
                print(line)
            }
            for worker in ext.workers {
                let app = worker.app.map { ", app \($0)" } ?? ""
                var line = "worker \(worker.pid) (\(ext.identifier)\(app)): up \(Int(worker.uptimeSeconds)) s, "
                line += "\(worker.inFlight) in flight, \(worker.requestsServed) served"
                if worker.recycling { line += ", recycling" }
                line += "; sandbox " + (worker.sandbox.isEmpty ? "not reported yet" : worker.sandbox.joined(separator: ", "))
                if !worker.sandboxSkipped.isEmpty { line += "; skipped: " + worker.sandboxSkipped.joined(separator: "; ") }
                print(line)
            }
        }
        exit(0)
    }

    static func format(_ v: Double) -> String {
        let rounded = (v * 100).rounded() / 100
        return String(rounded)
    }

    static func pad(_ s: String, _ n: Int) -> String { s + String(repeating: " ", count: max(1, n - s.count)) }
}

/// PlistValue as JSON (dates as Unix seconds, data as base64-free byte counts are not needed here: data is
/// rendered as an array of bytes).
enum JSON {
    static func render(_ v: PlistValue) -> String {
        switch v {
        case .string(let s): return quote(s)
        case .integer(let i): return String(i)
        case .real(let d): return d.isFinite ? String(d) : "null"
        case .bool(let b): return b ? "true" : "false"
        case .date(let d): return String(d.secondsSince1970)
        case .data(let bytes): return "[" + bytes.map(String.init).joined(separator: ",") + "]"
        case .array(let a): return "[" + a.map(render).joined(separator: ",") + "]"
        case .dictionary(let d):
            return "{" + d.keys.sorted().map { quote($0) + ":" + render(d[$0]!) }.joined(separator: ",") + "}"
        }
    }

    static func quote(_ s: String) -> String {
        var out = "\""
        for u in s.unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case let c where c.value < 0x20: out += "\\u" + String(repeating: "0", count: 4 - String(c.value, radix: 16).count) + String(c.value, radix: 16)
            default: out.unicodeScalars.append(u)
            }
        }
        return out + "\""
    }
}
