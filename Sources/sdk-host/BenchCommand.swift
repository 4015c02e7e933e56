// `sdk-host bench [--json] [--quick]` (`bench codec` or `bench drain` for one part; `bench --soak N`, SoakCommand.swift): every performance figure of shared/DESIGN.md measured in one run, each
// next to its ratio to the raw socketpair round trip between two processes on this machine (the physical limit),
// or to Foundation for the codec. `sdk-host bench codec` runs the codec part alone. Build with -c release.
import CSDKShim
import Dispatch
import SDKHost
import SDKPosix
import SDKWire
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

enum BenchCommand {
    static let usage = """
        usage: sdk-host bench [api | calls | codec | cold | daemon | drain | kill | languages | stream | throughput] [--json] [--quick] [--config PATH]
                              [--peer PATH] [--extension ID]
               sdk-host bench --soak N [--json]
          (none)     raw socketpair round trip, then embedded and daemon echo, throughput, cold starts, kills,
                     drain: every figure also as a ratio to the raw round trip (build with -c release)
          api        what beginRequest and pid(for:) cost their caller with 64 requests in flight: p50, p99.9,
                     max, and how many calls slept (the calling thread's voluntary context switches went up)
          calls      a host call's round trip beside its request's (the Renderer with 0 and 8 calls, paired),
                     embedded and through a daemon
          codec      the wire codec beside Foundation's
          cold       cold starts alone: default sandbox, Sandbox = none, no launcher, AllowSubprocesses, and
                     each step of the sandboxed launch as the launcher times it; with --extension ID, that
                     extension's too (bench/outside-extension/run.sh: one built in a package of its own)
          daemon     the daemon alone: warm echo, requests/s at 1, 8 and 64 in flight, RSS
          drain      shutdown with 2k and 32k requests queued
          kill       SIGKILL → interruption and SIGKILL → pidfd readable alone (100 kills, 20 with --quick)
          languages  the Swift, Python and C echo workers side by side: warm round trip and cold start
          throughput embedded requests/s at 1, 8 and 64 in flight, and at 64 with handlers on the host loop
          stream     1 GiB (256 MiB with --quick) echoed as a descriptor and as data frames; Ticker's partial
                     results through a stream
          --soak N   N requests with crashes, cancels and deadlines; RSS, descriptors and threads over time
          --quick    fewer samples
          --json     machine output
          --config   the configuration of the embedded hosts (extension paths; limits apply to the figures)
          --peer     also run another host's echo benchmark (bench/go-plugin/run.sh builds go-plugin's) after
                     the daemon's, and print its "key value" figures beside ours
        A bench stopped midway (Ctrl-C, SIGTERM, or SIGKILL) takes the daemon it started with it.
        """

    static func run(_ arguments: [String]) {
        let options = Options(arguments, valued: ["--soak", "--config", "--peer", "--extension"], boolean: ["--json", "--quick"], usage: usage)
        EmbeddedHost.configure(from: options)
        let json = options.has("--json")
        let quick = options.has("--quick")
        if let raw = options.value("--soak") {
            guard let count = Int(raw), count > 0 else { fail("--soak: '\(raw)' is not a positive request count", status: ExitStatus.usage, usage: usage) }
            SoakCommand.run(total: count, json: json)
        }
        let mode = options.positionals.first
        guard options.positionals.count <= 1, mode == nil || mode == "api" || mode == "codec" || mode == "drain" || mode == "stream"
            || mode == "throughput" || mode == "cold" || mode == "daemon" || mode == "kill" || mode == "calls" || mode == "languages" else {
            fail("unexpected argument '\(options.positionals.last ?? "")'", status: ExitStatus.usage, usage: usage)
        }
        var results = Results()
        if mode == "codec" {
            results.codec(CodecBench.measure(quick: quick))
        } else if mode == "api" {
            results.raw = RawBench.measure(roundTrips: 4000)
            let host = EmbeddedHost.make { $0.logHandler = { _, _ in } }
            _ = EmbeddedBench.pipelined(host, inFlight: 64, total: 2000)  // a worker up and warm
            results.api = APIBench.measure(host, total: quick ? 4000 : 20000)
            shutdown(host)
        } else if mode == "stream" {
            results.raw = RawBench.measure(roundTrips: 4000)
            let host = EmbeddedHost.make { $0.logHandler = { _, _ in } }
            results.attachment = StreamBench.attachment(host, bytes: quick ? 256 << 20 : 1 << 30, rounds: quick ? 1 : 3)
            results.stream = StreamBench.streaming(host, events: quick ? 5000 : 25000)
            shutdown(host)
        } else if mode == "throughput" {
            let scale = quick ? 1 : 5
            results.raw = RawBench.measure(roundTrips: 4000)
            let host = EmbeddedHost.make { $0.logHandler = { _, _ in } }
            _ = EmbeddedBench.pipelined(host, inFlight: 64, total: 2000)  // a worker up and warm
            EmbeddedBench.measureThroughput(host, into: &results, scale: scale)
            shutdown(host)
        } else if mode == "cold" {
            results.raw = RawBench.measure(roundTrips: 4000)
            EmbeddedBench.measureColdStarts(into: &results, samples: quick ? 10 : 50)
            if let other = options.value("--extension") {
                results.coldOther = (other, EmbeddedBench.coldStarts(of: other, samples: quick ? 10 : 50))
            }
        } else if mode == "daemon" {
            results.raw = RawBench.measure(roundTrips: 4000)
            results.rawBusyPoll = RawBench.measure(roundTrips: 4000, busyPoll: true)
            DaemonBench.measure(into: &results, scale: quick ? 1 : 5)
        } else if mode == "kill" {
            results.raw = RawBench.measure(roundTrips: 4000)
            let host = EmbeddedBench.hostForKills()
            (results.kill, results.killExit) = EmbeddedBench.killToInterruption(host, samples: quick ? 20 : 100)
            shutdown(host)
        } else if mode == "calls" {
            results.raw = RawBench.measure(roundTrips: 4000)
            let host = EmbeddedHost.make { $0.logHandler = { _, _ in } }
            results.hostCalls = HostCallBench.measure(host, pairs: quick ? 500 : 2500)
            shutdown(host)
            DaemonBench.measure(into: &results, scale: quick ? 1 : 5, onlyHostCalls: true)
        } else if mode == "languages" {
            results.raw = RawBench.measure(roundTrips: 4000)
            results.languages = EmbeddedBench.languages(scale: quick ? 1 : 5)
        } else if mode == "drain" {
            results.raw = RawBench.measure(roundTrips: 4000)
            for queued in [2000, 32000] { results.drain[queued] = EmbeddedBench.shutdownDrain(queued: queued) }
        } else {
            let scale = quick ? 1 : 5
            results.raw = RawBench.measure(roundTrips: 4000 * scale)
            results.rawBusyPoll = RawBench.measure(roundTrips: 4000 * scale, busyPoll: true)
            let host = EmbeddedBench.hostForKills()
            results.warm = EmbeddedBench.warmRoundTrips(host, count: 4000 * scale)
            results.warmOnLoop = EmbeddedBench.warmRoundTrips(host, count: 4000 * scale, onHostLoop: true)
            EmbeddedBench.measureThroughput(host, into: &results, scale: scale)
            results.api = APIBench.measure(host, total: 4000 * scale)
            results.hostCalls = HostCallBench.measure(host, pairs: 500 * scale)
            (results.echoWorkerRSSKB, results.echoWorkerTextRSSKB) = EmbeddedBench.echoWorkerRSS(host)
            (results.kill, results.killExit) = EmbeddedBench.killToInterruption(host, samples: 20 * scale)
            shutdown(host)
            // The same warm path with the runtime's leak check off: what the check costs per request.
            let unchecked = EmbeddedHost.make {
                $0.logHandler = { _, _ in }
                $0.defaultPolicy.leakCheckDelay = .seconds(0)
            }
            results.warmNoLeakCheck = EmbeddedBench.warmRoundTrips(unchecked, count: 4000 * scale)
            results.rpsNoLeakCheck64 = EmbeddedBench.pipelined(unchecked, inFlight: 64, total: 4000 * scale)
            // Large payloads and streaming: 1 GiB (256 MiB with --quick) as a descriptor against data frames.
            results.attachment = StreamBench.attachment(unchecked, bytes: quick ? 256 << 20 : 1 << 30, rounds: quick ? 1 : 3)
            results.stream = StreamBench.streaming(unchecked, events: 5000 * scale)
            shutdown(unchecked)
            for queued in [2000, 32000] { results.drain[queued] = EmbeddedBench.shutdownDrain(queued: queued) }
            EmbeddedBench.measureColdStarts(into: &results, samples: 10 * scale)
            results.languages = EmbeddedBench.languages(scale: scale)
            DaemonBench.measure(into: &results, scale: scale)
            if let peer = options.value("--peer") { results.peer = PeerBench.run(peer) }
            results.codec(CodecBench.measure(quick: quick))
        }
        print(json ? results.json : results.table)
    }

    static func shutdown(_ host: ExtensionHost) {
        let done = DispatchSemaphore(value: 0)
        host.shutdown { done.signal() }
        done.wait()
    }
}

func nowMicros() -> Double { Double(monotonicNanoseconds()) / 1000 }

/// The raw baseline: a 310-byte message (the typical begin frame) ping-ponged over a socketpair with a second
/// process that echoes bytes back (this binary, `sdk-host bench-peer`), with plain blocking read/write. With
/// `busyPoll`, both ends first poll for the host's default BusyPollMicroseconds before each blocking read, as the
/// host's loop and its workers do: the socket's own round trip under the same rule.
enum RawBench {
    static let messageSize = 310

    static func measure(roundTrips: Int, busyPoll: Bool = false) -> Samples {
        let exe = "/proc/self/exe"
        var samples = Samples()
        let arguments = ["sdk-host", "bench-peer"] + (busyPoll ? ["--busy-poll"] : [])
        guard let channels = try? spawnWithChannels(SpawnRequest(path: exe, arguments: arguments, environment: [])) else {
            fail("bench: cannot spawn the raw echo peer")
        }
        let fd = channels.socket.rawValue
        // Back to blocking for the ping-pong: the baseline is the simplest possible loop.
        _ = fcntl(fd, F_SETFL, 0)
        var message = [UInt8](repeating: 0x5A, count: messageSize)
        var reply = [UInt8](repeating: 0, count: messageSize)
        for i in 0..<(roundTrips + roundTrips / 10) {
            let start = nowMicros()
            message.withUnsafeBytes { _ = try? sendAll(fd, $0) }
            var got = 0
            while got < messageSize {
                if busyPoll { waitReadable(fd) }
                let n = reply.withUnsafeMutableBytes { read(fd, $0.baseAddress! + got, messageSize - got) }
                if n <= 0 { fail("bench: raw peer closed") }
                got += n
            }
            if i >= roundTrips / 10 { samples.add(nowMicros() - start) }  // the first tenth warms up
            message[0] = UInt8(truncatingIfNeeded: i)
        }
        channels.terminate(signal: SIGKILL)
        return samples
    }

    /// Busy polls until `fd` is readable, for at most the default budget; the blocking read follows.
    static func waitReadable(_ fd: Int32) {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        _ = busyPoll(nanoseconds: UInt64(HostConfiguration.defaultBusyPollMicroseconds) * 1000) { poll(&pfd, 1, 0) }
    }

    /// The peer: echo whatever arrives on fd 3 until EOF.
    static func peer(busyPoll: Bool) -> Never {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            if busyPoll { waitReadable(3) }
            let n = buffer.withUnsafeMutableBytes { read(3, $0.baseAddress, $0.count) }
            if n <= 0 { exit(0) }
            buffer.withUnsafeBytes { _ = try? sendAll(3, UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        }
    }
}

/// The same figures through a daemon this command starts (its own socket and config, errors-only log).
enum DaemonBench {
    static func measure(into results: inout Results, scale: Int, onlyHostCalls: Bool = false) {
        let folder = "/tmp/sdkhost-bench-\(getpid())"
        mkdir(folder, 0o700)
        let socket = "\(folder)/d.sock"
        let config = "\(folder)/sdk-host.plist"
        let extensions = EmbeddedHost.extensionSearchPaths().first ?? "Extensions"
        let xml = "<plist version=\"1.0\"><dict><key>SocketPath</key><string>\(socket)</string>"
            + "<key>LogLevel</key><string>error</string><key>CrashReportDirectory</key><string>\(folder)/crashes</string>"
            + "<key>ExtensionSearchPaths</key><array><string>\(extensions.hasPrefix("/") ? extensions : cwd() + "/" + extensions)</string></array></dict></plist>"
        _ = try? writeFile(config, Array(xml.utf8))
        guard let daemon = try? spawnWithChannels(SpawnRequest(
            path: "/proc/self/exe", arguments: ["sdk-host", "serve", "--config", config, "--exit-with-parent", String(getpid())],
            environment: []))
        else { fail("bench: cannot start the daemon") }
        // A bench stopped midway (Ctrl-C, SIGTERM) takes its daemon with it.
        let daemonPid = daemon.process.pid
        KillOnTermination.add(daemonPid)
        measure(daemonPid: daemonPid, socket: socket, into: &results, scale: scale, onlyHostCalls: onlyHostCalls)
        daemon.terminate(signal: SIGTERM)  // waits until it is reaped
        KillOnTermination.remove(daemonPid)
        for path in [config, "\(folder)/crashes", folder] { if unlink(path) != 0 { rmdir(path) } }
    }

    static func measure(daemonPid: pid_t, socket: String, into results: inout Results, scale: Int, onlyHostCalls: Bool = false) {
        var host: ExtensionHost?
        for _ in 0..<500 where host == nil {
            host = runAsync { try? await ExtensionHost.connect(socketPath: socket) }
            if host == nil { usleep(10_000) }
        }
        guard let host else { fail("bench: the daemon did not come up") }
        results.daemonHostCalls = HostCallBench.measure(host, pairs: 500 * scale)
        if onlyHostCalls { return BenchCommand.shutdown(host) }
        results.daemonRSSIdleKB = rssKB(of: daemonPid)
        results.daemonWarm = EmbeddedBench.warmRoundTrips(host, count: 4000 * scale)
        results.daemonWarmOnLoop = EmbeddedBench.warmRoundTrips(host, count: 4000 * scale, onHostLoop: true)
        for depth in [1, 8, 64] {
            results.daemonRPS[depth] = EmbeddedBench.pipelined(host, inFlight: depth, total: 4000 * scale)
        }
        // The rest of the 100k at 64 in flight, counting the daemon's CPU: far steadier than req/s, which moves
        // with how the scheduler places three processes on two cores. The app's and the workers' CPU beside it:
        // their sum per request bounds req/s (2 s of CPU per second ÷ the sum), whatever the scheduler does.
        let cpuBefore = cpuNanoseconds(of: daemonPid)
        let remaining = 100_000 - 4000 * scale * 4
        let split = CPUSplit.perRequest(requests: remaining, workersOf: daemonPid) {
            _ = EmbeddedBench.pipelined(host, inFlight: 64, total: remaining)
        }
        if let before = cpuBefore, let after = cpuNanoseconds(of: daemonPid) {
            results.daemonCPUPerRequestUs = Double(after - before) / 1000 / Double(remaining)
            (results.daemonAppCPUPerRequestUs, results.daemonWorkerCPUPerRequestUs) = split
        }
        results.daemonRSSAfter100kKB = rssKB(of: daemonPid)
        BenchCommand.shutdown(host)
    }

    static func cwd() -> String {
        var buffer = [CChar](repeating: 0, count: 4096)
        guard getcwd(&buffer, buffer.count) != nil else { return "." }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// Waits (blocking, on a bench thread) until `fd` is readable, for at most `milliseconds`; false if it was not.
func readable(_ fd: Int32, withinMilliseconds milliseconds: Int32) -> Bool {
    var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
    return poll(&pfd, 1, milliseconds) == 1
}

func rssKB(of pid: pid_t) -> Int { procStatus("\(pid)", ["VmRSS:"])[0] }

/// KiB of `pid`'s file-backed executable mappings that are mapped in (their smaps `Rss`). The kernel maps text 64
/// KiB around each page a process touches, and a killed process's teardown unmaps every one of those pages, so
/// this is what the hot-code layout (Extensions/hot-text.order) keeps down. -1 if smaps cannot be read.
func textRSSKB(of pid: pid_t) -> Int {
    guard let smaps = try? readFile("/proc/\(pid)/smaps") else { return -1 }
    var total = 0
    var inText = false
    for line in String(decoding: smaps, as: UTF8.self).split(separator: "\n") {
        let fields = line.split(separator: " ")
        if fields.count >= 5, fields[0].contains("-"), fields[1].count == 4 {  // a mapping's header line
            inText = fields[1].hasPrefix("r-x") && fields.count >= 6 && fields[5].hasPrefix("/")
        } else if inText, fields.count >= 2, fields[0] == "Rss:", let kb = Int(fields[1]) {
            total += kb
        }
    }
    return total
}

/// CPU time all of `pid`'s threads have run, in ns (the first field of each /proc/<pid>/task/*/schedstat).
func cpuNanoseconds(of pid: pid_t) -> UInt64? {
    guard let tasks = listDirectory("/proc/\(pid)/task") else { return nil }
    var total: UInt64 = 0
    for task in tasks {
        guard let stat = try? readFile("/proc/\(pid)/task/\(task)/schedstat") else { continue }
        total += String(decoding: stat, as: UTF8.self).split(separator: " ").first.flatMap { UInt64($0) } ?? 0
    }
    return total
}

/// CPU time this process has used, in ns, counting threads that have already exited (getrusage).
func ownCPUNanoseconds() -> UInt64 {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    let user = UInt64(usage.ru_utime.tv_sec) * 1_000_000_000 + UInt64(usage.ru_utime.tv_usec) * 1000
    let system = UInt64(usage.ru_stime.tv_sec) * 1_000_000_000 + UInt64(usage.ru_stime.tv_usec) * 1000
    return user + system
}

/// The live children of `pid` (any of its threads' children).
func childPids(of pid: pid_t) -> [pid_t] {
    (listDirectory("/proc/\(pid)/task") ?? []).flatMap { task -> [pid_t] in
        guard let text = try? readFile("/proc/\(pid)/task/\(task)/children") else { return [] }
        return String(decoding: text, as: UTF8.self).split(separator: " ").compactMap { pid_t($0) }
    }
}

/// CPU time of each live child of `pid`, with its own descendants' (a sandboxed worker is its launcher's child,
/// in a pid namespace under the launcher's pid 1), in ns, by child pid.
func childrenCPUNanoseconds(of pid: pid_t) -> [pid_t: UInt64] {
    func tree(_ pid: pid_t, depth: Int) -> UInt64 {
        (cpuNanoseconds(of: pid) ?? 0) + (depth < 4 ? childPids(of: pid).reduce(0) { $0 + tree($1, depth: depth + 1) } : 0)
    }
    var out: [pid_t: UInt64] = [:]
    for child in childPids(of: pid) { out[child] = tree(child, depth: 0) }
    return out
}

enum CPUSplit {
    /// Runs `body`, which makes `requests` requests, and returns the CPU per request in µs of this process (the
    /// app) and of `parent`'s children (its workers; nil if none was alive before and after). The reads of /proc
    /// for the workers stay outside the app's window.
    static func perRequest(requests: Int, workersOf parent: pid_t, _ body: () -> Void)
        -> (app: Double, workers: Double?)
    {
        let workersBefore = childrenCPUNanoseconds(of: parent)
        let appBefore = ownCPUNanoseconds()
        body()
        let appAfter = ownCPUNanoseconds()
        let workersAfter = childrenCPUNanoseconds(of: parent)
        let perRequest = { (nanoseconds: UInt64) in Double(nanoseconds) / 1000 / Double(requests) }
        return (perRequest(appAfter - appBefore), workers(before: workersBefore, after: workersAfter).map(perRequest))
    }

    /// The workers' CPU between two `childrenCPUNanoseconds` readings: only workers alive at both count, so a
    /// worker that started or ended in between is not charged its whole life. Nil if none was alive at both.
    private static func workers(before: [pid_t: UInt64], after: [pid_t: UInt64]) -> UInt64? {
        let both = before.keys.filter { after[$0] != nil }
        guard !both.isEmpty else { return nil }
        // A child's figure includes its live descendants, so it drops when one of them ends between the readings
        // (a sandboxed worker under its launcher): that child counts 0, not a wrapped difference. The wrap, added
        // with a checked `+`, had stopped `bench` with SIGILL in ~1 run in 10.
        return both.reduce(0) { sum, pid in
            let (end, start) = (after[pid]!, before[pid]!)
            return sum + (end > start ? end - start : 0)
        }
    }
}

/// Numeric fields of /proc/<process>/status (`process` a pid or "self"), such as "VmRSS:" (KiB) or "Threads:",
/// in the order asked; -1 for one that is absent.
func procStatus(_ process: String, _ names: [String]) -> [Int] {
    let lines = (try? readFile("/proc/\(process)/status")).map { String(decoding: $0, as: UTF8.self) }?
        .split(separator: "\n") ?? []
    return names.map { name in
        guard let line = lines.first(where: { $0.hasPrefix(name) }) else { return -1 }
        return line.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first.flatMap { Int($0) } ?? -1
    }
}
