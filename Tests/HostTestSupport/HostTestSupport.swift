// Shared by the host and fault tests: hosts wired to the bundled extensions, a recorder of callbacks, temporary
// extension folders, and resource snapshots for leak checks (descriptors, worker children, loop threads).
import SDKWire
import Dispatch
import SDKHost
import SDKPosix
import SDKSimulation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// SplitMix64 (SDKSimulation's): tiny, seedable, the same sequence on every machine, so a failure replays from a
/// printed seed.
package typealias SeededGenerator = SimulationRandom

/// The package root, from this file's path.
public let packageRoot: String = {
    var parts = "\(#filePath)".split(separator: "/", omittingEmptySubsequences: false)
    parts.removeLast(3)  // Tests/HostTestSupport/HostTestSupport.swift
    return parts.joined(separator: "/")
}()

/// Collects log lines so tests can assert that something was logged.
public final class LogCapture: Sendable {
    private let lines = Mutex<[String]>([])
    public init() {}
    public var handler: @Sendable (LogLevel, String) -> Void { { _, line in self.lines.withLock { $0.append(line) } } }
    public var all: [String] { lines.withLock { $0 } }
    public func contains(_ text: String) -> Bool { all.contains { $0.contains(text) } }
}

/// A host over the bundled extensions (plus `extraSearchPaths`), logging into a capture.
public func makeHost(
    extraSearchPaths: [String] = [], _ tweak: (inout HostConfiguration) -> Void = { _ in }
) throws -> (ExtensionHost, LogCapture) {
    let log = LogCapture()
    var configuration = HostConfiguration(extensionSearchPaths: ["\(packageRoot)/Extensions"] + extraSearchPaths)
    configuration.logLevel = .debug
    configuration.logHandler = log.handler
    // Heartbeats are tested where a test sets them. Elsewhere a worker touching memory on a loaded machine can
    // go unanswered for seconds, and the 2.5 s default would end a test's request as a hang it is not about.
    configuration.heartbeatTimeout = .seconds(10)
    tweak(&configuration)
    return (try ExtensionHost(configuration: configuration), log)
}

extension ExtensionHost {
    /// One extension's entry of `status()`, embedded or through the daemon; nil if absent or unreachable.
    public func status(of identifier: String) async -> ExtensionStatus? {
        await status()?.extensions.first { $0.identifier == identifier }
    }
}

/// The worker pid a request was sent to (0 until it is).
public final class AssignedPid: Sendable {
    let value = Mutex<pid_t>(0)
    public init() {}
    public var pid: pid_t { value.withLock { $0 } }
}

/// Begins a request whose input is one item titled `title`, noting the pid of the worker it is sent to (through
/// the daemon too: its `assigned` message).
public func beginNotingPid(_ ext: Extension, _ title: String, deadline: Double? = nil) -> (RequestID, AssignedPid) {
    let assigned = AssignedPid()
    let id = ext.beginRequest(withInputItems: [ExtensionItem(title: title)], deadline: deadline) { pid in
        assigned.value.withLock { $0 = pid }
    }
    return (id, assigned)
}

/// Records every terminal callback of the extensions it is attached to.
/// `host`'s extension `identifier`, with a new `Recorder` attached to it.
public func recordedExtension(_ host: ExtensionHost, _ identifier: String) throws -> (Extension, Recorder) {
    let ext = try host.extension(identifier: identifier)
    let recorder = Recorder()
    recorder.attach(to: ext)
    return (ext, recorder)
}

public final class Recorder: Sendable {
    private let outcomes = Mutex<[RequestID: [RequestOutcome]]>([:])
    public init() {}

    /// Installs all three handlers on `ext`.
    public func attach(to ext: Extension) {
        ext.requestCompletionHandler = { id, items in self.record(id, .completed(items)) }
        ext.requestCancellationHandler = { id, error in self.record(id, .cancelled(error)) }
        ext.requestInterruptionHandler = { id, reason in self.record(id, .interrupted(reason)) }
    }

    func record(_ id: RequestID, _ outcome: RequestOutcome) { outcomes.withLock { $0[id, default: []].append(outcome) } }

    /// Every callback received for `id`.
    public func callbacks(_ id: RequestID) -> [RequestOutcome] { outcomes.withLock { $0[id] ?? [] } }

    /// Total callbacks received.
    public var total: Int { outcomes.withLock { $0.values.reduce(0) { $0 + $1.count } } }

    /// Waits until each id has at least one callback; returns the first of each, or nil after `timeout` seconds.
    public func wait(for ids: [RequestID], timeout: Double = 60) async -> [RequestID: RequestOutcome]? {
        let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
        while monotonicNanoseconds() < deadline {
            let snapshot = outcomes.withLock { $0 }
            if ids.allSatisfy({ snapshot[$0]?.isEmpty == false }) {
                return Dictionary(uniqueKeysWithValues: ids.map { ($0, snapshot[$0]![0]) })
            }
            try? await Task.sleep(nanoseconds: 2_000_000)
        }
        return nil
    }

    /// Waits for one id.
    public func wait(for id: RequestID, timeout: Double = 60) async -> RequestOutcome? {
        await wait(for: [id], timeout: timeout)?[id]
    }
}

/// A request to Echo, a bystander beside whatever a test attacks the host with: its outcome, or nil after
/// `timeout` seconds. A host under attack from one worker must still serve the others.
public func bystanderEcho(_ host: ExtensionHost, _ title: String, timeout: Double = 60) async throws -> RequestOutcome? {
    let (echo, recorder) = try recordedExtension(host, "com.example.echo")
    let id = echo.beginRequest(withInputItems: [ExtensionItem(title: title)])
    return await recorder.wait(for: id, timeout: timeout)
}

/// "completed", "cancelled" or "interrupted".
public func kind(_ outcome: RequestOutcome) -> String {
    switch outcome {
    case .completed: "completed"
    case .cancelled: "cancelled"
    case .interrupted: "interrupted"
    }
}

/// Polls `condition` every 5 ms until it holds or `timeout` seconds pass.
/// Polls an async condition until it holds or `timeout` seconds pass.
public func eventually(timeout: Double = 30, _ condition: () async -> Bool) async -> Bool {
    let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
    while monotonicNanoseconds() < deadline {
        if await condition() { return true }
        try? await Task.sleep(nanoseconds: 5_000_000)
    }
    return await condition()
}

public func eventually(timeout: Double = 30, _ condition: () -> Bool) async -> Bool {
    let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
    while monotonicNanoseconds() < deadline {
        if condition() { return true }
        try? await Task.sleep(nanoseconds: 5_000_000)
    }
    return condition()
}

// MARK: Temporary folders and extensions

/// A folder of the test's own under /tmp, removed (with everything in it) when the value is released.
public final class TemporaryFolder {
    public let path: String

    public init(_ prefix: String = "sdkhost-test") throws {
        var template = "/tmp/\(prefix)-XXXXXX".utf8CString
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw SystemError("mkdtemp", errno: errno)
        }
        path = String(cString: made)
    }

    deinit { _ = removeTree(path) }
}

/// A temporary extension folder holding one manifest that points at a bundled executable.
public struct TemporaryExtension {
    public let root: String
    public let identifier: String

    /// Writes `<root>/<name>/Info.plist`. `policy` holds raw XML for the SDKHostPolicy dictionary's body.
    public init(identifier: String, executable: String, policy: String = "", raw: String? = nil) {
        var template = "/tmp/sdkhost-test-XXXXXX".utf8CString
        let dir = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        root = dir
        self.identifier = identifier
        mkdir("\(dir)/Ext", 0o755)
        let xml = raw ?? """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict>
              <key>CFBundleIdentifier</key><string>\(identifier)</string>
              <key>NSExtension</key><dict>
                <key>NSExtensionPointIdentifier</key><string>com.sdk-host.service</string>
                <key>NSExtensionExecutable</key><string>\(executable)</string>
                <key>SDKHostPolicy</key><dict>\(policy)</dict>
              </dict>
            </dict></plist>
            """
        writeFile("\(dir)/Ext/Info.plist", xml)
    }

    public func remove() {
        _ = unlink("\(root)/Ext/Info.plist")
        rmdir("\(root)/Ext")
        rmdir(root)
    }
}

public func writeFile(_ path: String, _ text: String) {
    do {
        try SDKHost.writeFile(path, Array(text.utf8), mode: 0o644)
    } catch {
        preconditionFailure("cannot write \(path): \(error)")
    }
}

// MARK: Resources

/// What the test process holds: open descriptors, live worker children, running event-loop threads.
public struct ResourceSnapshot: Equatable, CustomStringConvertible {
    public var descriptors: Int
    public var workerChildren: [pid_t]
    public var loopThreads: Int

    public static func take() -> ResourceSnapshot {
        ResourceSnapshot(
            descriptors: (listNames("/proc/self/fd")?.count ?? 1) - 1,  // minus the one listing itself
            // Every worker a host spawns, and the launcher in its place: a leaked launcher or Escaper counts too.
            workerChildren: childProcesses().filter { pid in
                let exe = readLink("/proc/\(pid)/exe") ?? ""
                return ["Echo", "/Crasher", "/Ticker", "/Escaper", "/sdk-host-launcher"].contains { exe.hasSuffix($0) }
            },
            loopThreads: (listNames("/proc/self/task") ?? []).filter {
                (readSmallFile("/proc/self/task/\($0)/comm") ?? "").hasPrefix(EventLoop.threadName)
            }.count)
    }

    public var description: String {
        "descriptors \(descriptors), worker children \(workerChildren), loop threads \(loopThreads)"
    }
}

/// Waits until the process holds no more descriptors, worker children or loop threads than `baseline`.
/// Returns nil when clean, or a description of what is left.
public func leaksSince(_ baseline: ResourceSnapshot, timeout: Double = 20) async -> String? {
    var now = ResourceSnapshot.take()
    let clean = await eventually(timeout: timeout) {
        now = ResourceSnapshot.take()
        return now.descriptors <= baseline.descriptors && now.workerChildren.isEmpty
            && now.loopThreads <= baseline.loopThreads
    }
    return clean ? nil : "before: \(baseline); after: \(now); open: \(openDescriptorTargets())"
}

/// The largest count a `withPeak` sampler has seen.
private final class PeakCount: Sendable {
    let value = Mutex(0)
}

/// Runs `body` while reading `count` every 2 ms; returns `body`'s result and the largest count seen (how many
/// workers ran at once, say).
public func withPeak<T>(of count: @escaping @Sendable () -> Int, _ body: () async throws -> T) async rethrows
    -> (result: T, peak: Int)
{
    let peak = PeakCount()
    let sampler = Task {
        while !Task.isCancelled {
            let n = count()
            peak.value.withLock { $0 = max($0, n) }
            try? await Task.sleep(nanoseconds: 2_000_000)
        }
    }
    defer { sampler.cancel() }
    let result = try await body()
    return (result, peak.value.withLock { $0 })
}

/// The fields of /proc/<pid>/stat after the command name: [0] state, [1] ppid, [11] utime, [12] stime.
/// `pid` is a number or "self"; nil if the process is gone.
public func procStatFields(_ pid: String) -> [Substring]? {
    guard let stat = readSmallFile("/proc/\(pid)/stat"), let close = stat.lastIndex(of: ")") else { return nil }
    return stat[stat.index(after: close)...].split(separator: " ")
}

/// Processes whose parent is `parent`. Zombies count by default: an unreaped child is a leak.
public func childProcesses(of parent: pid_t = getpid(), includingZombies: Bool = true) -> [pid_t] {
    (listNames("/proc") ?? []).compactMap { name -> pid_t? in
        guard let pid = pid_t(name), let fields = procStatFields(name), fields.count > 2,
            fields[1] == "\(parent)", includingZombies || fields[0] != "Z"
        else { return nil }
        return pid
    }
}

/// True while /proc/<pid> exists and is not a zombie.
/// Reaps a spawned child, polling for up to 10 s; throws ETIMEDOUT if it is still running.
public func waitForExit(_ process: borrowing SpawnedProcess) throws -> SDKPosix.ExitStatus {
    for _ in 0..<2000 {
        if let status = try process.reap() { return status }
        usleep(5000)
    }
    throw SystemError("reap", errno: ETIMEDOUT)
}

public func processIsAlive(_ pid: pid_t) -> Bool {
    guard let state = procStatFields("\(pid)")?.first else { return false }
    return state != "Z"
}

/// VmRSS of a process ("self" or a pid) in bytes, or nil if it is gone.
public func residentBytes(of pid: String = "self") -> Int? {
    guard let status = readSmallFile("/proc/\(pid)/status"),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
        let kb = Int(line.split(separator: " ").dropFirst().first ?? "")
    else { return nil }
    return kb * 1024
}

/// An environment variable, without Foundation.
public func environmentValue(_ name: String) -> String? { getenv(name).map { String(cString: $0) } }

public func openDescriptorTargets() -> [String] {
    (listNames("/proc/self/fd") ?? []).compactMap { readLink("/proc/self/fd/\($0)") }
}

public func listNames(_ path: String) -> [String]? {
    guard let dir = opendir(path) else { return nil }
    defer { closedir(dir) }
    var names: [String] = []
    while let entry = readdir(dir) {
        // Read where it lies: copying `entry.pointee` could read past the kernel's record (Syscalls.swift).
        let name = withDirectoryEntryName(entry) { String(decoding: $0, as: UTF8.self) }
        if name != "." && name != ".." { names.append(name) }
    }
    return names
}

public func readLink(_ path: String) -> String? {
    var buffer = [CChar](repeating: 0, count: 4096)
    let n = readlink(path, &buffer, 4095)
    guard n > 0 else { return nil }
    return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

public func readSmallFile(_ path: String) -> String? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    // Up to 1 MiB: command output and logs, not data.
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while bytes.count < 1 << 20 {
        let n = read(fd, &buffer, buffer.count)
        if n < 0 && errno == EINTR { continue }
        guard n >= 0 else { return nil }
        if n == 0 { break }
        bytes += buffer[0..<n]
    }
    return String(decoding: bytes, as: UTF8.self)
}

import Testing

extension ExtensionHost {
    /// An embedded host's counters added up, every crash report it keeps in memory, and its live workers: what
    /// the tests read, from `status()` (the one status model) and the uncut crash reports.
    public func inspect() async -> (StatusTotals, [CrashReport], [WorkerStatus]) {
        let status = await self.status()
        let crashes = await crashReportsInMemory()
        return (status?.totals ?? StatusTotals(adding: []), crashes, status?.extensions.flatMap(\.workers) ?? [])
    }
}

/// Runs `body` with a fresh host, then shuts it down and expects no leaked descriptors, worker children or
/// loop threads, and the ExtensionHost itself released (XCTAssertNoLeak style).
public func withHost(
    extraSearchPaths: [String] = [], sourceLocation: SourceLocation = #_sourceLocation,
    _ tweak: (inout HostConfiguration) -> Void = { _ in },
    _ body: (ExtensionHost, LogCapture) async throws -> Void
) async throws {
    await warmUpOnce()
    let baseline = ResourceSnapshot.take()
    weak var weakHost: ExtensionHost?
    do {
        let (host, log) = try makeHost(extraSearchPaths: extraSearchPaths, tweak)
        weakHost = host
        try await body(host, log)
        await host.shutdown()
    }
    let leak = await leaksSince(baseline)
    #expect(leak == nil, "resources left behind: \(leak ?? "")", sourceLocation: sourceLocation)
    let released = await eventually(timeout: 10) { weakHost == nil }
    #expect(released, "the ExtensionHost is still referenced after shutdown", sourceLocation: sourceLocation)
}

/// The one warm-up, started by the first caller; every caller waits for it to end. (A flag set as it started
/// let a test that came second take its baseline while libdispatch had yet to make its descriptors, and count
/// them as its leak.)
private let warmUp = Task<Void, Never> { await runWarmUp() }

/// Runs one full host cycle the first time it is called, and waits for it at every call. libdispatch creates its
/// own descriptors (a timerfd, a pipe) on first use and keeps them for the life of the process; that one-time
/// setup is not a leak, so baselines are taken after it.
public func warmUpOnce() async { await warmUp.value }

private func runWarmUp() async {
    // The process-wide log writer keeps an eventfd for the life of the process, like libdispatch.
    _ = LogWriter.standardError.pendingBytes
    guard let (host, _) = try? makeHost(), let ext = try? host.extension(identifier: "com.example.echo") else { return }
    let recorder = Recorder()
    recorder.attach(to: ext)
    _ = await recorder.wait(for: ext.beginRequest(withInputItems: [ExtensionItem(title: "warm-up")]))
    await host.shutdown()
}

/// Expects each manifest policy (raw SDKHostPolicy XML) to be refused as `invalidManifest`, with an error that
/// contains the expected text and names the manifest's file: the host starts and serves the others, and asking
/// for the bad one throws that error.
public func expectManifestErrors(_ cases: [(policy: String, expected: String)], executable: String,
                                 sourceLocation: SourceLocation = #_sourceLocation)
{
    for (policy, expected) in cases {
        let temp = TemporaryExtension(identifier: "com.example.bad-manifest", executable: executable, policy: policy)
        defer { temp.remove() }
        do {
            let (host, log) = try makeHost(extraSearchPaths: [temp.root])
            #expect(log.contains("\(temp.root)/Ext/Info.plist"), "the bad manifest is logged", sourceLocation: sourceLocation)
            #expect(host.extensionIdentifiers.contains("com.example.echo"), sourceLocation: sourceLocation)
            _ = try host.extension(identifier: "com.example.bad-manifest")
            Issue.record("\(policy) was accepted", sourceLocation: sourceLocation)
        } catch let error as HostError {
            #expect(error.code == .invalidManifest, sourceLocation: sourceLocation)
            #expect(error.detail.contains(expected) && error.detail.contains("\(temp.root)/Ext/Info.plist"),
                    "\(error.detail)", sourceLocation: sourceLocation)
        } catch {
            Issue.record("unexpected error \(error)", sourceLocation: sourceLocation)
        }
    }
}

/// Worker events from `stream` up to and including the first `.exited` one, or what came within `timeout`
/// seconds (a test must not hang on a stream that never yields).
public func eventsUntilExit(_ stream: AsyncStream<WorkerEvent>, timeout: Double = 30) async -> [WorkerEvent] {
    let collector = Task {
        var seen: [WorkerEvent] = []
        for await event in stream {
            seen.append(event)
            if event.kind == .exited { break }
        }
        return seen
    }
    let timer = Task {
        try await Task.sleep(nanoseconds: UInt64(timeout * 1e9))
        collector.cancel()
    }
    let seen = await collector.value
    timer.cancel()
    return seen
}

// MARK: Streaming

/// Every callback of the extensions it is attached to, partial results included, in the order they ran.
public final class Timeline: Sendable {
    public enum Entry: Sendable, Equatable {
        case partial(RequestID, [ExtensionItem])
        case ended(RequestID, RequestOutcome)
    }
    private let entries = Mutex<[Entry]>([])
    public init() {}

    /// Installs the progress handler and the three terminal handlers on `ext`.
    public func attach(to ext: Extension) {
        ext.requestProgressHandler = { id, items in self.entries.withLock { $0.append(.partial(id, items)) } }
        ext.requestCompletionHandler = { id, items in self.entries.withLock { $0.append(.ended(id, .completed(items))) } }
        ext.requestCancellationHandler = { id, error in self.entries.withLock { $0.append(.ended(id, .cancelled(error))) } }
        ext.requestInterruptionHandler = { id, reason in self.entries.withLock { $0.append(.ended(id, .interrupted(reason))) } }
    }

    /// `id`'s entries, in order.
    public func of(_ id: RequestID) -> [Entry] {
        entries.withLock { all in
            all.filter {
                switch $0 {
                case .partial(let x, _), .ended(let x, _): x == id
                }
            }
        }
    }

    /// How many partial results `id` got so far.
    public func partials(_ id: RequestID) -> Int {
        of(id).count { if case .partial = $0 { true } else { false } }
    }

    /// `id`'s terminal outcomes so far (exactly one, once it has ended).
    public func outcomes(_ id: RequestID) -> [RequestOutcome] {
        of(id).compactMap { if case .ended(_, let outcome) = $0 { outcome } else { nil } }
    }

    /// True when every partial result of `id` came before its first terminal callback.
    public func partialsPrecedeEnd(_ id: RequestID) -> Bool {
        let all = of(id)
        guard let end = all.firstIndex(where: { if case .ended = $0 { true } else { false } }) else { return true }
        return !all[end...].contains { if case .partial = $0 { true } else { false } }
    }
}

// MARK: Host services

/// What the app's service handlers saw.
public final class ServiceLog: Sendable {
    public init() {}
    private let state = Mutex<(started: [String], cancelled: [String], finished: [String])>(([], [], []))
    private let gate = Mutex(false)
    /// Lets the handlers waiting for it answer.
    public func release() { gate.withLock { $0 = true } }
    public var released: Bool { gate.withLock { $0 } }
    public func started(_ name: String) { state.withLock { $0.started.append(name) } }
    public func cancelled(_ name: String) { state.withLock { $0.cancelled.append(name) } }
    public func finished(_ name: String) { state.withLock { $0.finished.append(name) } }
    public var started: [String] { state.withLock { $0.started } }
    public var cancelled: [String] { state.withLock { $0.cancelled } }
    public var finished: [String] { state.withLock { $0.finished } }
}

/// What a host's log counted as dropped in `lines`: the sum of the numbers just before `marker` (" line(s) dropped
/// (more than" for output, " more line(s) about its messages dropped" for messages), and how many lines are such
/// counts rather than logged lines.
public func droppedCounts(in lines: [String], marker: String) -> (total: Int, countLines: Int) {
    let counts = lines.compactMap { line -> Int? in
        guard let range = line.firstRange(of: marker) else { return nil }
        return Int(line[..<range.lowerBound].split(separator: " ").last ?? "")
    }
    return (counts.reduce(0, +), counts.count)
}

/// A `document.part` service: answers part `name` with "<NAME>", or (for names starting "hold", "crash" and
/// "cap") waits until its Task is cancelled or the log is released.
public func partService(_ log: ServiceLog) -> HostServiceHandler {
    { call in
        let name = call.items.first?.title ?? ""
        log.started(name)
        if name.hasPrefix("hold") || name.hasPrefix("crash") || name.hasPrefix("cap") {
            while !Task.isCancelled, !log.released { try? await Task.sleep(nanoseconds: 5_000_000) }
            if Task.isCancelled {
                log.cancelled(name)
                throw CancellationError()
            }
        }
        log.finished(name)
        return [ExtensionItem(text: "<\(name.uppercased())>")]
    }
}

/// A `document.part` service for files: reads the file the call brought and answers with a new file holding its
/// bytes upper-cased and reversed.
public func fileService(_ log: ServiceLog) -> HostServiceHandler {
    { call in
        log.started(call.items.first?.title ?? "")
        guard let file = call.items.first?.fileAttachments.first else {
            throw ExtensionError(domain: "test", code: 1, message: "no file came with the call")
        }
        let bytes = try file.readAll()
        let answer = String(decoding: bytes, as: UTF8.self).uppercased().reversed()
        return [ExtensionItem(fileAttachments: [try FileAttachment(bytes: Array(String(answer).utf8))])]
    }
}

// MARK: Raw workers

/// The start of a worker written in Python on the raw protocol (docs/PROTOCOL.md), with no runtime: `sock` (the
/// host connection), `read_exact(n)` (exits 0 at end of file), `send(message)`, `receive()`, and `answered(m)`
/// (the handshake and pings). Tests append their message loop.
public let rawPythonWorkerPrelude = #"""
import os, sys, struct, socket, plistlib
sock = socket.socket(fileno=int(os.environ.get("SDKHOST_IPC_FD", "3")))
def read_exact(n):
    b = b""
    while len(b) < n:
        c = sock.recv(n - len(b))
        if not c: sys.exit(0)
        b += c
    return b
def send(d):
    p = plistlib.dumps(d, fmt=plistlib.FMT_BINARY)
    sock.sendall(struct.pack(">I", len(p)) + p)
def receive():
    return plistlib.loads(read_exact(struct.unpack(">I", read_exact(4))[0]))
def welcome():
    send({"type": "welcome", "version": 2, "identifier": os.environ["SDKHOST_EXTENSION_ID"], "pid": os.getpid()})
def answered(m):
    """Answers a hello or a ping; False for any other message (the test's loop handles it)."""
    if m["type"] == "hello":
        welcome()
    elif m["type"] == "ping":
        send({"type": "pong", "seq": m["seq"]})
    else:
        return False
    return True

"""#

/// Writes `<folder>/<name>/` holding `script.py` (the raw prelude, then `loop`) and a manifest that runs it with
/// `interpreter` as `identifier`; `folder` is made readable to the worker's user.
public func writeRawPythonExtension(in folder: String, name: String, identifier: String, interpreter: String,
                                    loop: String) {
    chmod(folder, 0o755)
    mkdir("\(folder)/\(name)", 0o755)
    writeFile("\(folder)/\(name)/script.py", rawPythonWorkerPrelude + loop)
    writeFile("\(folder)/\(name)/Info.plist", """
        <?xml version="1.0" encoding="UTF-8"?>
        <plist version="1.0"><dict>
          <key>CFBundleIdentifier</key><string>\(identifier)</string>
          <key>NSExtension</key><dict>
            <key>NSExtensionPointIdentifier</key><string>com.sdk-host.service</string>
            <key>NSExtensionExecutable</key><string>script.py</string>
            <key>SDKHostInterpreter</key><string>\(interpreter)</string>
          </dict>
        </dict></plist>
        """)
}
