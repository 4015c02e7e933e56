// `sdk-host crashes [--leaks] [--json] [--config P] [--dir D]`: the crash reports the daemon wrote, oldest first;
// with --leaks, the leak reports beside them.
import SDKHost
import SDKWire

#if canImport(Glibc)
import Glibc
#endif

enum CrashesCommand {
    static let usage = """
        usage: sdk-host crashes [--leaks] [--json] [--config PATH] [--dir FOLDER]
          The crash reports in the configuration's CrashReportDirectory (or FOLDER), oldest first: time, extension,
          pid, reason, requests in flight, and the line that says why it died (the Swift runtime's "Fatal error: …").
          --leaks: the leak reports instead. --json: every field, the stderr tail included.
        """

    static func run(_ arguments: [String]) -> Never {
        let options = Options(arguments, valued: ["--config", "--dir"], boolean: ["--json", "--leaks"], usage: usage)
        guard let directory = options.value("--dir") ?? loadConfiguration(options).host.crashReportDirectory else {
            fail("crashes: no crash report folder configured", status: ExitStatus.usage)
        }
        if options.has("--leaks") { leaks(in: directory, json: options.has("--json")) }
        let reports = CrashReportStore.load(directory: directory)
        if options.has("--json") {
            print(JSON.render(.array(reports.map(\.plist))))
            exit(0)
        }
        if reports.isEmpty {
            print("no crash reports in \(directory)")
            exit(0)
        }
        for r in reports {
            // What a report holds came from a worker or a file in a folder: shown with control characters escaped,
            // so that no report prints a line of its own.
            print("\(formatTime(r.time))  \(r.extensionIdentifier.displaySafe())  pid \(r.pid)  "
                + "\(String(describing: r.reason).displaySafe())  in flight: \(r.inFlightRequests.count)")
            if let line = r.fatalErrorLine { print("    \(String(line.prefix(200)).displaySafe())") }
        }
        exit(0)
    }

    static func leaks(in directory: String, json: Bool) -> Never {
        let reports = CrashReportStore.loadLeaks(directory: directory)
        if json {
            print(JSON.render(.array(reports.map(\.plist))))
            exit(0)
        }
        if reports.isEmpty { print("no leak reports in \(directory)") }
        for r in reports {
            print("\(formatTime(r.time))  \(r.extensionIdentifier.displaySafe())  pid \(r.pid)  request \(r.requestID)  "
                + "\(r.alive.joined(separator: " and ").displaySafe()) alive \(Double(r.afterMilliseconds) / 1000) s after it ended")
        }
        exit(0)
    }

    static func formatTime(_ t: Double) -> String {
        var seconds = time_t(t)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : String(n) }
        return "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday))T\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec))Z"
    }
}
