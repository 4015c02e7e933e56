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
        usage: sdk-host bench [codec | cold | daemon | drain | kill | stream | throughput] [--json] [--quick] [--config PATH] [--peer PATH]
               sdk-host bench --soak N [--json]
          (none)     raw socketpair round trip, then embedded and daemon echo, throughput, cold starts, kills,
                     drain: every figure also as a ratio to the raw round trip (build with -c release)
          codec      the wire codec beside Foundation's
          cold       cold starts alone: default sandbox, Sandbox = none, no launcher, AllowSubprocesses
          daemon     the daemon alone: warm echo, requests/s at 1, 8 and 64 in flight, RSS
          drain      shutdown with 2k and 32k requests queued
          kill       SIGKILL → interruption and SIGKILL → pidfd readable alone (100 kills, 20 with --quick)
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
        let options = Options(arguments, valued: ["--soak", "--config", "--peer"], boolean: ["--json", "--quick"], usage: usage)
        EmbeddedHost.configure(from: options)
        let json = options.has("--json")
        let quick = options.has("--quick")
        if let raw = options.value("--soak") {
            guard let count = Int(raw), count > 0 else { fail("--soak: '\(raw)' is not a positive request count\n\(usage)", status: ExitStatus.usage) }
            SoakCommand.run(total: count, json: json)
        }
        let mode = options.positionals.first
        guard options.positionals.count <= 1, mode == nil || mode == "codec" || mode == "drain" || mode == "stream"
            || mode == "throughput" || mode == "cold" || mode == "daemon" || mode == "kill" else {
            fail("unexpected argument '\(options.positionals.last ?? "")'\n\(usage)", status: ExitStatus.usage)
        }
        var results = Results()
        if mode == "codec" {
            results.codec(CodecBench.measure(quick: quick))
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
        } else if mode == "daemon" {
            results.raw = RawBench.measure(roundTrips: 4000)
            results.rawBusyPoll = RawBench.measure(roundTrips: 4000, busyPoll: true)
            DaemonBench.measure(into: &results, scale: quick ? 1 : 5)
        } else if mode == "kill" {
            results.raw = RawBench.measure(roundTrips: 4000)
            let host = EmbeddedBench.hostForKills()
            (results.kill, results.killExit) = EmbeddedBench.killToInterruption(host, samples: quick ? 20 : 100)
            shutdown(host)
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
            (results.echoWorkerRSSKB, results.echoWorkerTextRSSKB) = EmbeddedBench.echoWorkerRSS(host)
            (results.kill, results.killExit) = EmbeddedBench.killToInterruption(host, samples: 20 * scale)
            shutdown(host)
            // The same warm path with the runtime's leak check off: what the check costs per request.
            let unchecked = EmbeddedHost.make {
                $0.logHandler = { _, _ in }
                $0.defaultPolicy.leakCheckDelay = 0
            }
            results.warmNoLeakCheck = EmbeddedBench.warmRoundTrips(unchecked, count: 4000 * scale)
            results.rpsNoLeakCheck64 = EmbeddedBench.pipelined(unchecked, inFlight: 64, total: 4000 * scale)
            // Large payloads and streaming: 1 GiB (256 MiB with --quick) as a descriptor against data frames.
            results.attachment = StreamBench.attachment(unchecked, bytes: quick ? 256 << 20 : 1 << 30, rounds: quick ? 1 : 3)
            results.stream = StreamBench.streaming(unchecked, events: 5000 * scale)
            shutdown(unchecked)
            for queued in [2000, 32000] { results.drain[queued] = EmbeddedBench.shutdownDrain(queued: queued) }
            EmbeddedBench.measureColdStarts(into: &results, samples: 10 * scale)
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
    static func measure(into results: inout Results, scale: Int) {
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
        measure(daemonPid: daemonPid, socket: socket, into: &results, scale: scale)
        daemon.terminate(signal: SIGTERM)  // waits until it is reaped
        KillOnTermination.remove(daemonPid)
        for path in [config, "\(folder)/crashes", folder] { if unlink(path) != 0 { rmdir(path) } }
    }

    static func measure(daemonPid: pid_t, socket: String, into results: inout Results, scale: Int) {
        var host: ExtensionHost?
        for _ in 0..<500 where host == nil {
            host = runAsync { try? await ExtensionHost.connect(socketPath: socket) }
            if host == nil { usleep(10_000) }
        }
        guard let host else { fail("bench: the daemon did not come up") }
        results.daemonRSSIdleKB = rssKB(of: daemonPid)
        results.daemonWarm = EmbeddedBench.warmRoundTrips(host, count: 4000 * scale)
        results.daemonWarmOnLoop = EmbeddedBench.warmRoundTrips(host, count: 4000 * scale, onHostLoop: true)
        for depth in [1, 8, 64] {
            results.daemonRPS[depth] = EmbeddedBench.pipelined(host, inFlight: depth, total: 4000 * scale)
        }
        // The rest of the 100k at 64 in flight, counting the daemon's CPU: far steadier than req/s, which moves
        // with how the scheduler places three processes on two cores.
        let cpuBefore = cpuNanoseconds(of: daemonPid)
        let remaining = 100_000 - 4000 * scale * 4
        _ = EmbeddedBench.pipelined(host, inFlight: 64, total: remaining)
        if let before = cpuBefore, let after = cpuNanoseconds(of: daemonPid) {
            results.daemonCPUPerRequestUs = Double(after - before) / 1000 / Double(remaining)
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

enum EmbeddedBench {
    /// One item shaped like SampleMessages.begin, so the begin frame is the same ~310 bytes as the raw message.
    static let item: ExtensionItem = {
        let message = SampleMessages.begin
        return try! ExtensionItem(plist: message["items"]![0]!)
    }()

    static func echo(_ host: ExtensionHost) -> Extension {
        do {
            return try host.extension(identifier: "com.example.echo")
        } catch {
            fail("bench: \(error)")
        }
    }

    static func warmRoundTrips(_ host: ExtensionHost, count: Int, onHostLoop: Bool = false) -> Samples {
        let ext = echo(host)
        ext.callsHandlersOnHostLoop = onHostLoop
        let done = DispatchSemaphore(value: 0)
        ext.requestCompletionHandler = { _, _ in done.signal() }
        ext.requestInterruptionHandler = { _, reason in fail("bench: echo interrupted: \(reason)") }
        var samples = Samples()
        for i in 0..<(count + count / 10) {
            let start = nowMicros()
            ext.beginRequest(withInputItems: [item])
            done.wait()
            if i >= count / 10 { samples.add(nowMicros() - start) }
        }
        return samples
    }

    /// Requests per second with `inFlight` outstanding at all times.
    static func pipelined(_ host: ExtensionHost, inFlight: Int, total: Int, onHostLoop: Bool = false) -> Double {
        let ext = echo(host)
        ext.callsHandlersOnHostLoop = onHostLoop
        let slots = DispatchSemaphore(value: inFlight)
        let finished = DispatchSemaphore(value: 0)
        let remaining = Atomic<Int>(total)
        ext.requestCompletionHandler = { _, _ in
            slots.signal()
            if remaining.subtract(1, ordering: .relaxed).newValue == 0 { finished.signal() }
        }
        let start = nowMicros()
        for _ in 0..<total {
            slots.wait()
            ext.beginRequest(withInputItems: [item])
        }
        finished.wait()
        return Double(total) / ((nowMicros() - start) / 1e6)
    }

    /// The warm Echo worker's VmRSS and the part of it that is its executable's text (`textRSSKB`), in KiB.
    static func echoWorkerRSS(_ host: ExtensionHost) -> (Int, text: Int) {
        let ext = echo(host)
        let pid = Mutex<pid_t?>(nil)
        let done = DispatchSemaphore(value: 0)
        ext.requestCompletionHandler = { _, _ in done.signal() }
        ext.beginRequest(withInputItems: [item], deadline: nil, onWorkerAssigned: { p in pid.withLock { $0 = p } })
        done.wait()
        guard let p = pid.withLock({ $0 }) else { return (-1, -1) }
        return (rssKB(of: p), textRSSKB(of: p))
    }

    /// A quiet host whose crash-loop limit is out of the kill figure's way: it kills a worker per sample, and that
    /// is measurement, not a crash loop to quarantine.
    static func hostForKills() -> ExtensionHost {
        EmbeddedHost.make {
            $0.logHandler = { _, _ in }
            $0.defaultPolicy.restartLimitBurst = 1000
        }
    }

    /// SIGKILL of a worker running a request → that request's interruption callback, in µs; and, in the same
    /// samples, SIGKILL → the worker's pidfd readable as this thread sees it: when the kernel has torn the process
    /// down and reports it dead. The host learns of the death from its socket's end, which the kernel closes in
    /// the same teardown, so the first figure cannot be much below the second.
    static func killToInterruption(_ host: ExtensionHost, samples count: Int) -> (Samples, exit: Samples) {
        guard let ext = try? host.extension(identifier: "com.example.crasher") else { fail("bench: no crasher") }
        let interrupted = DispatchSemaphore(value: 0)
        let at = Mutex<Double>(0)
        ext.requestInterruptionHandler = { _, _ in
            at.withLock { $0 = nowMicros() }
            interrupted.signal()
        }
        var samples = Samples()
        var exits = Samples()
        for _ in 0..<count {
            let assigned = DispatchSemaphore(value: 0)
            let pid = Mutex<pid_t?>(nil)
            ext.beginRequest(withInputItems: [ExtensionItem(title: "slow:60000")], deadline: 120, onWorkerAssigned: { p in
                pid.withLock { $0 = p }
                assigned.signal()
            })
            assigned.wait()
            usleep(20_000)  // let the worker start running the request
            let worker = pid.withLock { $0 }!
            let pidfd = sdk_pidfd_open(worker)
            let start = nowMicros()
            kill(worker, SIGKILL)
            if pidfd >= 0 {
                if readable(pidfd, withinMilliseconds: 10_000) { exits.add(nowMicros() - start) }
                close(pidfd)
            }
            interrupted.wait()
            samples.add(at.withLock { $0 } - start)
        }
        return (samples, exits)
    }

    /// `queued` requests waiting behind busy workers, then `shutdown()`: µs per request from the call to the last
    /// interruption callback. Equal figures at 2k and 32k show the drain is linear (the first slice was quadratic).
    static func shutdownDrain(queued: Int) -> Double {
        let host = EmbeddedHost.make {
            $0.logHandler = { _, _ in }
            $0.maxQueuedRequests = queued + 64
        }
        guard let ext = try? host.extension(identifier: "com.example.crasher") else { fail("bench: no crasher") }
        let ended = Atomic<Int>(0)
        let allEnded = DispatchSemaphore(value: 0)
        let busy = 32  // the Crasher's MaxWorkers 4 × MaxConcurrentRequests 8
        let total = busy + queued
        ext.callsHandlersOnHostLoop = true
        ext.requestInterruptionHandler = { _, _ in
            if ended.add(1, ordering: .relaxed).newValue == total { allEnded.signal() }
        }
        let running = DispatchSemaphore(value: 0)
        let long = [ExtensionItem(title: "slow:60000")]
        for _ in 0..<busy {
            _ = ext.beginRequest(withInputItems: long, deadline: 120, onWorkerAssigned: { _ in running.signal() })
        }
        for _ in 0..<busy { running.wait() }
        for _ in 0..<queued { _ = ext.beginRequest(withInputItems: long, deadline: 120) }
        let start = nowMicros()
        host.shutdown {}
        allEnded.wait()
        let perRequest = (nowMicros() - start) / Double(total)
        BenchCommand.shutdown(host)
        return perRequest
    }

    /// A fresh host with no worker: beginRequest → completion, in µs; and the first request of another fresh
    /// host after `Extension.prewarm()` has returned (the worker spawned and handshaken, as `MinWarmWorkers` does).
    /// Requests per second at 1, 8 and 64 in flight, and at 64 with handlers on the host loop.
    static func measureThroughput(_ host: ExtensionHost, into results: inout Results, scale: Int) {
        for depth in [1, 8, 64] {
            results.rps[depth] = pipelined(host, inFlight: depth, total: 4000 * scale)
        }
        results.rpsOnLoop64 = pipelined(host, inFlight: 64, total: 4000 * scale, onHostLoop: true)
    }

    /// Cold starts with the default sandbox, without it, without the launcher, and with the pid namespace
    /// AllowSubprocesses adds.
    static func measureColdStarts(into results: inout Results, samples: Int) {
        (results.cold, results.prewarmed) = coldStarts(samples: samples)
        results.coldUnsandboxed = coldStarts(samples: samples) { $0.defaultPolicy.sandbox = .none }.cold
        results.coldDirect = coldStarts(samples: samples) {
            $0.defaultPolicy.sandbox = .none
            $0.launcherPath = "/nonexistent/sdk-host-launcher"  // Sandbox = none without a launcher: spawned directly
        }.cold
        results.coldSubprocesses = coldStarts(samples: samples) { $0.defaultPolicy.allowSubprocesses = true }.cold
        results.bareStart = bareStarts(samples: samples * 4)
    }

    /// The Echo executable spawned with no host connection until its `main` has run, in µs: posix_spawn, exec,
    /// the static C library's and the Swift runtime's start-up, then the worker runtime's first line (that it has
    /// no connection) on stderr. A cold start does all of this and more, and none of it is sdk-host's.
    static func bareStarts(samples count: Int) -> Samples {
        guard let dir = HostConfiguration.executableDirectory else { fail("bench: no executable directory") }
        var samples = Samples()
        for _ in 0..<count {
            let request = SpawnRequest(path: dir + "/Echo", arguments: ["Echo"], environment: ["SDKHOST_IPC_FD=99"])
            let start = nowMicros()
            guard let channels = try? spawnWithChannels(request) else { fail("bench: cannot spawn \(dir)/Echo") }
            let spoke = readable(channels.stderr.rawValue, withinMilliseconds: 10_000)
            let end = nowMicros()
            guard spoke, readable(channels.process.pidfd.rawValue, withinMilliseconds: 10_000) else {
                channels.terminate(signal: SIGKILL)  // reaped and closed: a failed bench leaves no process behind
                fail("bench: Echo, spawned alone, did not report the missing connection and exit within 10 s")
            }
            samples.add(end - start)
            _ = try? channels.process.reap()
            channels.close()
        }
        return samples
    }

    static func coldStarts(samples count: Int, _ tweak: (inout HostConfiguration) -> Void = { _ in })
        -> (cold: Samples, prewarmed: Samples)
    {
        var cold = Samples(), prewarmed = Samples()
        for _ in 0..<count {
            let host = EmbeddedHost.make {
                $0.logHandler = { _, _ in }
                tweak(&$0)
            }
            settle(host)
            cold.add(firstRequest(echo(host)))
            BenchCommand.shutdown(host)
            let warmHost = EmbeddedHost.make {
                $0.logHandler = { _, _ in }
                tweak(&$0)
            }
            let ext = echo(warmHost)
            let ready = DispatchSemaphore(value: 0)
            Task {
                _ = try? await ext.prewarm()
                ready.signal()
            }
            ready.wait()
            prewarmed.add(firstRequest(ext))
            BenchCommand.shutdown(warmHost)
        }
        return (cold, prewarmed)
    }
}

/// Waits until `host` has run the work it queued when it was made (such as making the first worker's temp
/// folder), as an app's host has long before its first request: a cold start is timed from a settled host.
func settle(_ host: ExtensionHost) {
    let settled = DispatchSemaphore(value: 0)
    host.inspect { _, _, _ in settled.signal() }
    settled.wait()
}

/// One request's beginRequest → completion, in µs.
func firstRequest(_ ext: Extension) -> Double {
    let done = DispatchSemaphore(value: 0)
    ext.requestCompletionHandler = { _, _ in done.signal() }
    let start = nowMicros()
    ext.beginRequest(withInputItems: [EmbeddedBench.item])
    done.wait()
    return nowMicros() - start
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
