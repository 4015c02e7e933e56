// CrashReportStore: crash reports on disk, one binary plist per crash, named so that name order is time order,
// and pruned to the newest `limit`. Writes happen on a serial utility queue, never on the event loop.
import SDKWire
import Dispatch
import SDKPosix

#if canImport(Glibc)
import Glibc
#endif

extension CrashReport {
    /// The on-disk form (read it with `sdk-host plist decode` or `sdk-host crashes`).
    public var plist: PlistValue { plist(time: .date(PlistDate(secondsSince1970: time))) }

    /// Its Codable form: the plist with `time` as seconds since 1970 (below).
    var codablePlist: PlistValue { plist(time: .real(time)) }

    private func plist(time: PlistValue) -> PlistValue {
        var fields: [String: PlistValue] = [
            "extension": .string(extensionIdentifier), "pid": .integer(Int64(pid)), "reason": reason.plist,
            "reasonText": .string(reason.description), "time": time,
            "inFlight": .array(inFlightRequests.map { .string($0.uuidString) }), "stderrTail": .string(stderrTail),
            "fatalError": .string(fatalErrorLine ?? ""),
        ]
        if let app { fields["app"] = .string(app) }
        return .dictionary(fields)
    }

    /// Reads the on-disk form; nil if a required field is missing.
    public init?(plist: PlistValue) {
        guard let ext = plist["extension"]?.stringValue, let pid = plist["pid"]?.integerValue,
            let reason = plist["reason"], let time = reportTime(plist["time"])
        else { return nil }
        self.init(
            extensionIdentifier: ext, pid: Int32(truncatingIfNeeded: pid), reason: InterruptionReason(plist: reason),
            time: time,
            inFlightRequests: (plist["inFlight"]?.arrayValue ?? []).compactMap { $0.stringValue.flatMap(RequestID.init(uuidString:)) },
            stderrTail: plist["stderrTail"]?.stringValue ?? "",
            fatalErrorLine: plist["fatalError"]?.stringValue.flatMap { $0.isEmpty ? nil : $0 })
        app = plist["app"]?.stringValue
    }
}

/// A worker's report that a request's context (or its async handler's Task) outlived the request.
public struct LeakReport: Sendable, Equatable {
    public var extensionIdentifier: String
    public var pid: Int32
    public var requestID: RequestID
    /// "context", "task".
    public var alive: [String]
    /// How long after the request ended the worker found them alive.
    public var afterMilliseconds: Int64
    /// Seconds since the Unix epoch.
    public var time: Double
    /// The daemon's app ("uid/name") whose worker it was; nil for a shared pool or an embedded host.
    public var app: String?

    /// The on-disk form.
    public var plist: PlistValue { plist(time: .date(PlistDate(secondsSince1970: time))) }

    /// Its Codable form: the plist with `time` as seconds since 1970 (below).
    var codablePlist: PlistValue { plist(time: .real(time)) }

    private func plist(time: PlistValue) -> PlistValue {
        var fields: [String: PlistValue] = ["extension": .string(extensionIdentifier), "pid": .integer(Int64(pid)), "request": .string(requestID.uuidString),
         "alive": .array(alive.map(PlistValue.string)), "afterMs": .integer(afterMilliseconds), "time": time]
        if let app { fields["app"] = .string(app) }
        return .dictionary(fields)
    }

    /// Creates a report.
    public init(extensionIdentifier: String, pid: Int32, requestID: RequestID, alive: [String],
                 afterMilliseconds: Int64, time: Double)
    {
        self.extensionIdentifier = extensionIdentifier
        self.pid = pid
        self.requestID = requestID
        self.alive = alive
        self.afterMilliseconds = afterMilliseconds
        self.time = time
    }

    /// Reads the on-disk form; nil if a required field is missing.
    public init?(plist: PlistValue) {
        guard let ext = plist["extension"]?.stringValue, let pid = plist["pid"]?.integerValue,
            let id = plist["request"]?.stringValue.flatMap(RequestID.init(uuidString:)), let time = reportTime(plist["time"])
        else { return nil }
        self.init(extensionIdentifier: ext, pid: Int32(truncatingIfNeeded: pid), requestID: id,
                  alive: (plist["alive"]?.arrayValue ?? []).compactMap(\.stringValue),
                  afterMilliseconds: plist["afterMs"]?.integerValue ?? 0, time: time)
        app = plist["app"]?.stringValue
    }
}

/// A report's `time`: a date on disk and in the `statusReport` plist; seconds since 1970 where the plist went
/// through JSON (`status --json`).
private func reportTime(_ value: PlistValue?) -> Double? {
    value?.dateValue?.secondsSince1970 ?? value?.doubleValue
}

// Codable through the plist form above, which is also the file on disk, with one change: `time` is a number of
// seconds since 1970, as `time` is in Swift, not a date (a date under JSON and other encoders is seconds since
// 2001). A `HostStatus` that holds reports encodes and decodes them so; `reportTime` reads either.
extension CrashReport: Codable {
    public func encode(to encoder: any Encoder) throws { try codablePlist.encode(to: encoder) }

    public init(from decoder: any Decoder) throws {
        self = try decodeReport(from: decoder, CrashReport.init(plist:), needs: "extension, pid, reason and time")
    }
}

extension LeakReport: Codable {
    public func encode(to encoder: any Encoder) throws { try codablePlist.encode(to: encoder) }

    public init(from decoder: any Decoder) throws {
        self = try decodeReport(from: decoder, LeakReport.init(plist:), needs: "extension, pid, request and time")
    }
}

/// A report read from its plist form under any decoder.
private func decodeReport<Report>(from decoder: any Decoder, _ read: (PlistValue) -> Report?, needs: String) throws -> Report {
    guard let report = read(try PlistValue(from: decoder)) else {
        throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "a report needs \(needs)"))
    }
    return report
}

/// Crash and leak reports on disk: the daemon's `CrashReportDirectory`, or an embedded host's. Read them with
/// `load(directory:)` and `loadLeaks(directory:)`, or `sdk-host crashes [--leaks]`.
public final class CrashReportStore: Sendable {
    package let directory: String
    let limit: Int
    private let queue = DispatchQueue(label: "sdk-host.crash-reports", qos: .utility)

    package init(directory: String, limit: Int) throws(HostError) {
        self.directory = directory
        self.limit = max(1, limit)
        guard makeDirectories(directory, mode: 0o700) else {
            throw HostError(.invalidConfiguration, "crash report folder \(directory): cannot create it: "
                + String(cString: strerror(errno)))
        }
    }

    /// Writes `report` in the background, then removes the oldest files beyond the limit.
    func save(_ report: CrashReport) {
        write(report.plist, time: report.time, pid: report.pid, extensionID: report.extensionIdentifier, kind: Self.crashSuffix)
    }

    /// Writes a leak report beside the crash reports (`….leak.plist`), pruned the same way, separately.
    func saveLeak(_ report: LeakReport) {
        write(report.plist, time: report.time, pid: report.pid, extensionID: report.extensionIdentifier, kind: Self.leakSuffix)
    }

    static let crashSuffix = ".crash.plist", leakSuffix = ".leak.plist"

    private func write(_ value: PlistValue, time: Double, pid: Int32, extensionID: String, kind: String) {
        queue.async { [directory, limit] in
            let name = crashFileName(time: time, pid: pid, extensionID: extensionID, suffix: kind)
            let bytes = BinaryPlistEncoder.encode(value)
            let temporary = "\(directory)/.\(name).tmp"
            let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
            guard fd >= 0 else { return }
            let ok = bytes.withUnsafeBytes { raw in Glibc.write(fd, raw.baseAddress, raw.count) == raw.count }
            close(fd)
            if ok { rename(temporary, "\(directory)/\(name)") } else { unlink(temporary) }
            // Pruned by fair share, as in memory: a looping extension loses its own oldest reports first.
            let reports = CrashReportStore.fileNames(in: directory, suffix: kind)
            for index in crashReportEvictions(reports.map { crashFileExtension($0, suffix: kind) }, limit: limit) {
                unlink("\(directory)/\(reports[index])")
            }
        }
    }

    /// Waits for pending writes (tests and tools).
    package func flush() { queue.sync {} }

    static func fileNames(in directory: String, suffix: String = crashSuffix) -> [String] {
        (listDirectory(directory) ?? []).filter { $0.hasSuffix(suffix) && !$0.hasPrefix(".") }.sorted()
    }

    /// Every readable leak report in `directory`, oldest first.
    public static func loadLeaks(directory: String) -> [LeakReport] {
        plists(in: directory, suffix: leakSuffix).compactMap(LeakReport.init(plist:))
    }

    /// Every readable crash report in `directory`, oldest first; unreadable files are skipped.
    public static func load(directory: String) -> [CrashReport] {
        plists(in: directory, suffix: crashSuffix).compactMap(CrashReport.init(plist:))
    }

    /// The decoded files with `suffix`, oldest first; unreadable ones are skipped.
    static func plists(in directory: String, suffix: String) -> [PlistValue] {
        fileNames(in: directory, suffix: suffix).compactMap { name in
            // A file put in the folder may be a FIFO or a link to a device: read only if a plain file of a report's size.
            guard let bytes = try? readRegularFile("\(directory)/\(name)", maxBytes: 4 << 20) else { return nil }
            return try? BinaryPlistDecoder.decode(bytes)
        }
    }
}

/// "<17-digit microseconds since 1970>-<extension>-<pid>.crash.plist" (or `.leak.plist`): name order is time order.
func crashFileName(time: Double, pid: Int32, extensionID: String, suffix: String = CrashReportStore.crashSuffix) -> String {
    let micros = String(UInt64(max(0, time) * 1e6))
    return String(repeating: "0", count: max(0, 17 - micros.count)) + micros + "-\(extensionID)-\(pid)\(suffix)"
}


/// The extension a crash file name belongs to (the part between the time and the pid).
func crashFileExtension(_ name: String, suffix: String = CrashReportStore.crashSuffix) -> String {
    guard let firstDash = name.firstIndex(of: "-") else { return name }
    let rest = name[name.index(after: firstDash)...].dropLast(suffix.count)
    guard let lastDash = rest.lastIndex(of: "-") else { return String(rest) }
    return String(rest[..<lastDash])
}
