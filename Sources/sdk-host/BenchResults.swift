// The bench's figures: latency samples, and the table or JSON object every figure is printed in, each next to its
// ratio to the raw round trip (or to Foundation for the codec). Keys are stable; docs/BENCHMARKS.md lists them.

/// Latency samples in µs.
struct Samples: Sendable {
    var values: [Double] = []
    mutating func add(_ v: Double) { values.append(v) }
    func percentile(_ p: Double) -> Double {
        guard !values.isEmpty else { return .nan }
        let sorted = values.sorted()
        return sorted[min(sorted.count - 1, Int(Double(sorted.count - 1) * p))]
    }
}

/// "12.34" with `digits` decimals (no Foundation).
func fixed(_ v: Double, _ digits: Int) -> String {
    guard v.isFinite else { return "n/a" }
    var scale = 1.0
    for _ in 0..<digits { scale *= 10 }
    let scaled = Int64((abs(v) * scale).rounded())
    let whole = scaled / Int64(scale), fraction = scaled % Int64(scale)
    let fractionText = digits == 0 ? "" : "." + String(repeating: "0", count: digits - String(fraction).count) + String(fraction)
    return (v < 0 ? "-" : "") + String(whole) + fractionText
}

func padRight(_ s: String, _ width: Int) -> String { s + String(repeating: " ", count: max(1, width - s.count)) }

/// Everything measured, printed as a table or one JSON object with stable keys.
struct Results {
    var raw: Samples?
    var api: APIBench.Result?
    /// The raw round trip with both ends busy polling as the host and its workers do.
    var rawBusyPoll: Samples?
    var warm: Samples?
    var rps: [Int: Double] = [:]
    var cold: Samples?
    var coldUnsandboxed: Samples?
    var coldSubprocesses: Samples?
    /// `bench cold --extension ID`: that extension's cold starts, beside Echo's.
    var coldOther: (identifier: String, samples: Samples)?
    /// `bench languages`: each language's bundled echo worker, warm and cold.
    var languages: [Language] = []
    struct Language {
        let name: String
        let identifier: String
        let warm: Samples
        let cold: Samples
    }
    var coldDirect: Samples?
    var bareStart: Samples?
    /// The sandboxed launch's steps, timed by the launcher (µs), in its order.
    var sandboxLayers: [(step: String, samples: Samples)] = []
    var prewarmed: Samples?
    var kill: Samples?
    /// SIGKILL → the worker's pidfd readable, in the same samples as `kill`.
    var killExit: Samples?
    var warmNoLeakCheck: Samples?
    var rpsNoLeakCheck64: Double?
    var drain: [Int: Double] = [:]
    var echoWorkerRSSKB: Int?
    /// Of which the Echo executable's text mapped in.
    var echoWorkerTextRSSKB: Int?
    var daemonWarm: Samples?
    var warmOnLoop: Samples?
    var daemonWarmOnLoop: Samples?
    var rpsOnLoop64: Double?
    var daemonRPS: [Int: Double] = [:]
    var daemonRSSIdleKB: Int?
    var daemonRSSAfter100kKB: Int?
    /// CPU time of the daemon's threads per request at 64 in flight (µs).
    var daemonCPUPerRequestUs: Double?
    var daemonAppCPUPerRequestUs: Double?
    var daemonWorkerCPUPerRequestUs: Double?
    var embeddedAppCPUPerRequestUs: Double?
    var embeddedWorkerCPUPerRequestUs: Double?
    var codecResult: CodecBench.Result?
    var attachment: StreamBench.AttachmentResult?
    var stream: StreamBench.StreamResult?
    /// A host call's round trip beside its request's, embedded and through the daemon (HostCallBench).
    var hostCalls: HostCallBench.Result?
    var daemonHostCalls: HostCallBench.Result?
    /// Another host's figures (`--peer`), e.g. go-plugin's `go_plugin_rtt_p50_us` and `go_plugin_rps_64`.
    var peer: [(key: String, value: Double)] = []

    mutating func codec(_ r: CodecBench.Result) { codecResult = r }

    var fields: [(key: String, value: Double, ratio: String, label: String)] {
        var out: [(String, Double, String, String)] = []
        let rawP50 = raw?.percentile(0.5) ?? .nan
        let rawRPS = 1e6 / rawP50
        func ratio(_ v: Double, _ base: Double) -> String { base.isNaN ? "" : fixed(v / base, 2) + "×" }
        if let raw {
            out.append(("raw_rtt_p50_us", rawP50, "1.00×", "raw socketpair round trip p50 (µs)"))
            out.append(("raw_rtt_p99_us", raw.percentile(0.99), ratio(raw.percentile(0.99), rawP50), "raw socketpair round trip p99 (µs)"))
            out.append(("raw_rps", rawRPS, "1.00×", "raw round trips/s (1/p50)"))
        }
        if let r = rawBusyPoll {
            out.append(("raw_busy_poll_rtt_p50_us", r.percentile(0.5), ratio(r.percentile(0.5), rawP50),
                        "raw round trip p50, both ends busy polling (µs)"))
        }
        if let warm {
            out.append(("embedded_rtt_p50_us", warm.percentile(0.5), ratio(warm.percentile(0.5), rawP50), "embedded warm echo p50 (µs)"))
            out.append(("embedded_rtt_p99_us", warm.percentile(0.99), ratio(warm.percentile(0.99), rawP50), "embedded warm echo p99 (µs)"))
        }
        if let w = warmOnLoop {
            out.append(("embedded_rtt_loop_p50_us", w.percentile(0.5), ratio(w.percentile(0.5), rawP50), "embedded echo p50, handlers on host loop (µs)"))
            out.append(("embedded_rtt_loop_p99_us", w.percentile(0.99), ratio(w.percentile(0.99), rawP50), "embedded echo p99, handlers on host loop (µs)"))
        }
        if let api {
            for (name, samples, sleeps) in [("begin", api.begin, api.beginSleeps), ("pid", api.pid, api.pidSleeps)] {
                let call = name == "begin" ? "beginRequest" : "pid(for:)"
                for (p, tag) in [(0.5, "p50"), (0.999, "p999"), (1.0, "max")] {
                    let v = samples.percentile(p)
                    out.append(("api_\(name)_\(tag)_us", v, ratio(v, rawP50), "\(call) with 64 in flight, \(tag == "p999" ? "p99.9" : tag) (µs)"))
                }
                out.append(("api_\(name)_sleeps", Double(sleeps), "", "\(call) calls that slept, of \(samples.values.count)"))
            }
        }
        for (prefix, where_, r) in [("embedded", "embedded", hostCalls), ("daemon", "through the daemon", daemonHostCalls)] {
            guard let r else { continue }
            let request = r.request.percentile(0.5), call = r.call.percentile(0.5)
            out.append(("\(prefix)_call_request_p50_us", request, ratio(request, rawP50), "Renderer request, no host calls, \(where_), p50 (µs)"))
            out.append(("\(prefix)_host_call_p50_us", call, ratio(call, rawP50), "one host call's round trip, \(where_), p50 (µs)"))
            out.append(("\(prefix)_host_call_p99_us", r.call.percentile(0.99), ratio(r.call.percentile(0.99), rawP50),
                        "one host call's round trip, \(where_), p99 (µs)"))
        }
        for depth in rps.keys.sorted() {
            out.append(("embedded_rps_\(depth)", rps[depth]!, ratio(rps[depth]!, rawRPS), "embedded requests/s, \(depth) in flight"))
        }
        if let w = warmNoLeakCheck {
            out.append(("embedded_rtt_no_leak_check_p50_us", w.percentile(0.5), ratio(w.percentile(0.5), rawP50), "embedded echo p50, leak check off (µs)"))
        }
        if let r = rpsNoLeakCheck64 {
            out.append(("embedded_rps_64_no_leak_check", r, ratio(r, rawRPS), "embedded requests/s, 64, leak check off"))
        }
        if let r = rpsOnLoop64 {
            out.append(("embedded_rps_loop_64", r, ratio(r, rawRPS), "embedded requests/s, 64, handlers on loop"))
        }
        if let cold {
            out.append(("cold_start_p50_ms", cold.percentile(0.5) / 1000, ratio(cold.percentile(0.5), rawP50), "cold start to first reply p50 (ms)"))
            out.append(("cold_start_p90_ms", cold.percentile(0.9) / 1000, ratio(cold.percentile(0.9), rawP50), "cold start to first reply p90 (ms)"))
            // The default profile is the sandboxed one: the same figure under the name the sandbox targets use.
            out.append(("cold_start_sandboxed_p50_ms", cold.percentile(0.5) / 1000, ratio(cold.percentile(0.5), rawP50), "cold start, default sandbox, p50 (ms)"))
        }
        if let c = coldUnsandboxed {
            out.append(("cold_start_unsandboxed_p50_ms", c.percentile(0.5) / 1000, ratio(c.percentile(0.5), rawP50), "cold start, Sandbox = none, p50 (ms)"))
        }
        if let c = coldDirect {
            out.append(("cold_start_no_launcher_p50_ms", c.percentile(0.5) / 1000, ratio(c.percentile(0.5), rawP50), "cold start, extension spawned directly, p50 (ms)"))
        }
        if let c = bareStart {
            out.append(("bare_start_p50_ms", c.percentile(0.5) / 1000, ratio(c.percentile(0.5), rawP50), "Echo spawned alone until main runs, p50 (ms)"))
        }
        for (step, samples) in sandboxLayers {
            let key = "sandbox_layer_" + step.map { $0.isLetter || $0.isNumber ? String($0) : "_" }.joined() + "_p50_us"
            out.append((key, samples.percentile(0.5), ratio(samples.percentile(0.5), rawP50), "cold start, launcher step '\(step)', p50 (µs)"))
        }
        if let (identifier, c) = coldOther {
            let echo = cold.map { ", " + fixed(c.percentile(0.5) / $0.percentile(0.5), 2) + "× Echo" } ?? ""
            out.append(("cold_start_extension_p50_ms", c.percentile(0.5) / 1000, ratio(c.percentile(0.5), rawP50),
                        "cold start, \(identifier)\(echo), p50 (ms)"))
        }
        for language in languages {
            // Each language's bundled echo worker; the identifiers are in docs/BENCHMARKS.md.
            let key = language.name.lowercased()
            let swift = languages.first { $0.name == "Swift" }
            func versusSwift(_ mine: Samples, _ theirs: Samples?) -> String {
                theirs.map { language.name == "Swift" ? "" : ", " + fixed(mine.percentile(0.5) / $0.percentile(0.5), 1) + "× Swift" } ?? ""
            }
            out.append(("language_\(key)_warm_p50_us", language.warm.percentile(0.5), ratio(language.warm.percentile(0.5), rawP50),
                        "warm echo \(language.name) p50 (µs)\(versusSwift(language.warm, swift?.warm))"))
            out.append(("language_\(key)_warm_p99_us", language.warm.percentile(0.99), ratio(language.warm.percentile(0.99), rawP50),
                        "warm echo \(language.name) p99 (µs)"))
            out.append(("language_\(key)_cold_p50_ms", language.cold.percentile(0.5) / 1000, ratio(language.cold.percentile(0.5), rawP50),
                        "cold start \(language.name) p50 (ms)\(versusSwift(language.cold, swift?.cold))"))
        }
        if let c = coldSubprocesses {
            out.append(("cold_start_subprocesses_p50_ms", c.percentile(0.5) / 1000, ratio(c.percentile(0.5), rawP50), "cold start, AllowSubprocesses (pid ns), p50 (ms)"))
        }
        if let p = prewarmed {
            out.append(("prewarmed_start_p50_ms", p.percentile(0.5) / 1000, ratio(p.percentile(0.5), rawP50), "first reply, worker pre-warmed, p50 (ms)"))
            out.append(("prewarmed_start_p90_ms", p.percentile(0.9) / 1000, ratio(p.percentile(0.9), rawP50), "first reply, worker pre-warmed, p90 (ms)"))
        }
        if let kill {
            out.append(("kill_to_interrupt_p50_us", kill.percentile(0.5), ratio(kill.percentile(0.5), rawP50), "SIGKILL → interruption callback p50 (µs)"))
            out.append(("kill_to_interrupt_p99_us", kill.percentile(0.99), ratio(kill.percentile(0.99), rawP50), "SIGKILL → interruption callback p99 (µs)"))
        }
        if let exit = killExit, !exit.values.isEmpty {
            out.append(("kill_to_exit_p50_us", exit.percentile(0.5), ratio(exit.percentile(0.5), rawP50), "SIGKILL → pidfd says dead p50 (µs)"))
            out.append(("kill_to_exit_p99_us", exit.percentile(0.99), ratio(exit.percentile(0.99), rawP50), "SIGKILL → pidfd says dead p99 (µs)"))
        }
        for queued in drain.keys.sorted() {
            out.append(("shutdown_drain_us_per_request_\(queued)", drain[queued]!, ratio(drain[queued]!, rawP50),
                        "shutdown with \(queued) queued, per request (µs)"))
        }
        if let daemonWarm {
            out.append(("daemon_rtt_p50_us", daemonWarm.percentile(0.5), ratio(daemonWarm.percentile(0.5), rawP50), "daemon warm echo p50 (µs)"))
            out.append(("daemon_rtt_p99_us", daemonWarm.percentile(0.99), ratio(daemonWarm.percentile(0.99), rawP50), "daemon warm echo p99 (µs)"))
        }
        if let w = daemonWarmOnLoop {
            out.append(("daemon_rtt_loop_p50_us", w.percentile(0.5), ratio(w.percentile(0.5), rawP50), "daemon echo p50, handlers on client loop (µs)"))
        }
        // The warm paths against a socket that polls as they do, so that polling is not credited to the code.
        if let polled = rawBusyPoll?.percentile(0.5) {
            for (key, samples, label) in [("embedded", warm, "embedded"), ("daemon", daemonWarm, "daemon")] {
                guard let p50 = samples?.percentile(0.5) else { continue }
                out.append(("\(key)_rtt_p50_vs_raw_busy_poll", p50 / polled, "", "\(label) warm p50 ÷ busy-polling raw p50"))
            }
        }
        for depth in daemonRPS.keys.sorted() {
            out.append(("daemon_rps_\(depth)", daemonRPS[depth]!, ratio(daemonRPS[depth]!, rawRPS), "daemon requests/s, \(depth) in flight"))
        }
        if let cpu = daemonCPUPerRequestUs {
            out.append(("daemon_cpu_us_per_request", cpu, "", "the daemon's CPU per request at 64 in flight (µs)"))
        }
        // CPU per request at 64 in flight, by process: what bounds req/s on two cores (2e6 ÷ the sum).
        for (mode, app, workers, daemon) in [("embedded", embeddedAppCPUPerRequestUs, embeddedWorkerCPUPerRequestUs, nil),
                                             ("daemon", daemonAppCPUPerRequestUs, daemonWorkerCPUPerRequestUs, daemonCPUPerRequestUs)] {
            guard let app, let workers else { continue }
            out.append(("\(mode)_app_cpu_us_per_request", app, "", "\(mode) app CPU per request, 64 (µs)"))
            out.append(("\(mode)_worker_cpu_us_per_request", workers, "", "\(mode) worker CPU per request, 64 (µs)"))
            out.append(("\(mode)_total_cpu_us_per_request", app + workers + (daemon ?? 0), "", "\(mode) total CPU per request, 64 (µs)"))
        }
        for figure in peer {
            let base = figure.key.contains("rps") ? rawRPS : rawP50
            let vsRaw = figure.key.contains("_cpu_") ? "" : ratio(figure.value, base)  // CPU time is no round trip
            out.append((figure.key, figure.value, vsRaw, "peer: " + figure.key))
        }
        // Ours against the peer's, where both measured the same thing.
        for (ours, theirs, label) in [("daemon_rps_64", "go_plugin_rps_64", "daemon vs go-plugin, requests/s at 64 in flight"),
                                      ("daemon_rtt_p50_us", "go_plugin_rtt_p50_us", "daemon vs go-plugin, warm echo p50"),
                                      ("daemon_total_cpu_us_per_request", "go_plugin_total_cpu_us_per_request",
                                       "daemon vs go-plugin, CPU per request at 64 in flight")] {
            guard let mine = out.first(where: { $0.0 == ours })?.1, let peerValue = peer.first(where: { $0.key == theirs })?.value
            else { continue }
            out.append((ours + "_vs_go_plugin", mine / peerValue, "", label + " (×)"))
        }
        if let a = attachment {
            out.append(("attachment_bytes", Double(a.bytes), "", "attachment payload (bytes)"))
            out.append(("attachment_descriptor_ms", a.descriptorMs, ratio(a.descriptorMs * 1000, rawP50), "echo as one descriptor attachment, p50 (ms)"))
            out.append(("attachment_data_ms", a.dataMs, ratio(a.dataMs * 1000, rawP50), "echo as 8 MiB data frames, p50 (ms)"))
            out.append(("attachment_speedup", a.dataMs / a.descriptorMs, "", "descriptor vs data frames (×, target ≥ 20)"))
        }
        if let s = stream {
            out.append(("stream_events_per_s", s.eventsPerSecond, ratio(s.eventsPerSecond, rawRPS), "Ticker partial results/s through a stream"))
            out.append(("stream_latency_p50_us", s.latency.percentile(0.5), ratio(s.latency.percentile(0.5), rawP50), "partial result, made → taken, p50 (µs)"))
            out.append(("stream_latency_p99_us", s.latency.percentile(0.99), ratio(s.latency.percentile(0.99), rawP50), "partial result, made → taken, p99 (µs)"))
        }
        if let rss = daemonRSSIdleKB { out.append(("daemon_rss_idle_kb", Double(rss), "", "daemon RSS idle (KiB)")) }
        if let rss = daemonRSSAfter100kKB { out.append(("daemon_rss_100k_kb", Double(rss), "", "daemon RSS after 100k requests (KiB)")) }
        if let rss = echoWorkerRSSKB { out.append(("echo_worker_rss_kb", Double(rss), "", "idle Echo worker RSS (KiB)")) }
        if let rss = echoWorkerTextRSSKB {
            out.append(("echo_worker_text_rss_kb", Double(rss), "", "of which its executable's text mapped in (KiB)"))
        }
        if let c = codecResult {
            out.append(("codec_message_bytes", Double(c.bytes), "", "typical message size (bytes)"))
            out.append(("codec_encode_us", c.encode, ratio(c.encode, c.foundationEncode) + " of Foundation", "codec encode (µs)"))
            out.append(("codec_decode_us", c.decode, ratio(c.decode, c.foundationDecode) + " of Foundation", "codec decode (µs)"))
            out.append(("codec_assigned_decode_us", c.assignedDecode, "", "'assigned' decoded to a message (µs)"))
            out.append(("codec_assigned_flat_us", c.assignedFlat, "", "'assigned' read as our flat frame (µs)"))
            out.append(("codec_begin_frame_us", c.beginFrame, "", "a begin from its items to frame bytes (µs)"))
            out.append(("codec_begin_message_us", c.beginMessage, "", "a begin's payload to a Message, as receivers read it (µs)"))
            out.append(("codec_begin_message_tree_us", c.beginMessageTree, "", "the same through a PlistValue tree (µs)"))
            out.append(("foundation_encode_us", c.foundationEncode, "", "Foundation encode (µs)"))
            out.append(("foundation_decode_us", c.foundationDecode, "", "Foundation decode (µs)"))
        }
        return out
    }

    var table: String {
        var lines = ["figure                                       value        vs raw p50 (or Foundation)"]
        for f in fields {
            let v = f.value >= 1000 ? fixed(f.value, 0) : fixed(f.value, 2)
            lines.append(padRight(f.label, 45) + padRight(v, 13) + f.ratio)
        }
        return lines.joined(separator: "\n")
    }

    var json: String {
        "{" + fields.map { "\"\($0.key)\":\($0.value.isFinite ? fixed($0.value, 3) : "null")" }.joined(separator: ",") + "}"
    }
}
