// `sdk-host status [--json] [--socket P] [--config P]`: the daemon's extensions, workers and counters.
import SDKHost

#if canImport(Glibc)
import Glibc
#endif

enum StatusCommand {
    static let usage = "usage: sdk-host status [--json] [--socket PATH] [--config PATH]"

    static func run(_ arguments: [String]) -> Never {
        let options = Options(arguments, valued: ["--config", "--socket"], boolean: ["--json"], usage: usage)
        let socket = loadConfiguration(options).socketPath
        let report: PlistValue? = runAsync {
            guard let host = try? await ExtensionHost.connect(socketPath: socket, reconnectTimeout: 2) else { return nil }
            let report = await host.daemonStatus()
            await host.shutdown()
            return report
        }
        guard let report else { fail("status: no daemon answering on \(socket) (start one with `sdk-host serve`)", status: 1) }
        if options.has("--json") {
            print(JSON.render(report))
            exit(0)
        }
        let totals = report["totals"] ?? [:]
        print("daemon pid \(report["pid"]?.integerValue ?? 0), up \(Int(report["uptimeSeconds"]?.doubleValue ?? 0)) s, socket \(socket)")
        print(pad("extension", 24) + pad("workers (pid/uptime s/in flight)", 36) + pad("done", 7) + pad("cancel", 7)
            + pad("intr", 7) + pad("crash", 7) + "hang")
        for ext in report["extensions"]?.arrayValue ?? [] {
            let workers = (ext["workers"]?.arrayValue ?? []).map {
                "\($0["pid"]?.integerValue ?? 0)/\(Int($0["uptimeSeconds"]?.doubleValue ?? 0))/\($0["inFlight"]?.integerValue ?? 0)"
            }.joined(separator: " ")
            print(pad(ext["identifier"]?.stringValue ?? "?", 24) + pad(workers.isEmpty ? "-" : workers, 36)
                + counters(ext))
        }
        print(pad("total", 24) + pad("", 36) + counters(totals))
        for ext in report["extensions"]?.arrayValue ?? [] {
            for worker in ext["workers"]?.arrayValue ?? [] {
                let layers = (worker["sandbox"]?.arrayValue ?? []).compactMap(\.stringValue)
                let skipped = (worker["sandboxSkipped"]?.arrayValue ?? []).compactMap(\.stringValue)
                print("worker \(worker["pid"]?.integerValue ?? 0) (\(ext["identifier"]?.stringValue ?? "?")): sandbox "
                    + (layers.isEmpty ? "not reported yet" : layers.joined(separator: ", "))
                    + (skipped.isEmpty ? "" : "; skipped: " + skipped.joined(separator: "; ")))
            }
        }
        exit(0)
    }

    static func counters(_ d: PlistValue) -> String {
        ["completions", "cancellations", "interruptions", "crashes"].map { pad(String(d[$0]?.integerValue ?? 0), 7) }.joined()
            + String(d["hangs"]?.integerValue ?? 0)
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
