// One app's faults stay its own (issue 10): through a real daemon, two client apps (the same uid, different app
// names) get their own workers of a `perApp` extension, so one app's crash-inducing input and crash loop never
// interrupt the other's request; `shared` opts back into one set of workers.
import SDKWire
import HostTestSupport
import SDKHost
import Testing
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

@Suite(.serialized) struct IsolationTests {
    /// Begins a request with a recorder of its own, noting the worker pid the daemon assigned it.
    static func run(_ ext: Extension, _ title: String) -> (RequestID, Recorder, AssignedPid) {
        let recorder = Recorder()
        recorder.attach(to: ext)
        let (id, pid) = beginNotingPid(ext, title)
        return (id, recorder, pid)
    }

    @Test func oneAppsCrashDoesNotInterruptAnotherAppsRequest() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let alpha = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "alpha")
        let beta = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "beta")
        let alphaCrasher = try alpha.extension(identifier: "com.example.crasher")
        let betaCrasher = try beta.extension(identifier: "com.example.crasher")

        let (slow, recorder, alphaPid) = Self.run(alphaCrasher, "slow:1500")
        #expect(await eventually { alphaPid.pid != 0 })
        let (segv, betaRecorder, betaPid) = Self.run(betaCrasher, "segv")
        #expect(await betaRecorder.wait(for: segv) == .interrupted(.signal(SIGSEGV)))
        #expect(await recorder.wait(for: slow) == .completed([ExtensionItem(title: "slow:1500")]))
        #expect(alphaPid.pid != betaPid.pid, "each app has its own worker")

        // Beta loops into quarantine; alpha is untouched by it.
        for _ in 0..<5 {
            await #expect(throws: RequestFailure.self) { try await betaCrasher.perform([ExtensionItem(title: "abort")]) }
        }
        await #expect(throws: RequestFailure.interrupted(.quarantined)) {
            try await betaCrasher.perform([ExtensionItem(title: "echo")])
        }
        #expect(try await alphaCrasher.perform([ExtensionItem(title: "echo")]) == [ExtensionItem(title: "echo")])

        let status = try #require(await alpha.status())
        let crasher = try #require(status.extensions.first { $0.identifier == "com.example.crasher" })
        let uid = getuid()
        let betaPool = try #require(crasher.pools.first { $0.app == "\(uid)/beta" })
        #expect(betaPool.state == .quarantined && betaPool.crashCount >= 5 && (betaPool.retryInSeconds ?? 0) > 0)
        #expect(crasher.pools.first { $0.app == "\(uid)/alpha" }?.state == .running)
        #expect(crasher.state == .quarantined)
        #expect(crasher.workers.contains { $0.app == "\(uid)/alpha" })
        await alpha.shutdown()
        await beta.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func sharedWorkersServeEveryApp() async throws {
        let shared = TemporaryExtension(identifier: "com.example.shared-echo", executable: "Echo",
                                        policy: "<key>WorkerSharing</key><string>shared</string><key>MaxWorkers</key><integer>1</integer>")
        defer { shared.remove() }
        let daemon = try await DaemonProcess(extraSearchPaths: [shared.root])
        defer { daemon.remove() }
        let alpha = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "alpha")
        let beta = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "beta")
        let (a, ra, pa) = Self.run(try alpha.extension(identifier: "com.example.shared-echo"), "a")
        let (b, rb, pb) = Self.run(try beta.extension(identifier: "com.example.shared-echo"), "b")
        #expect(await ra.wait(for: a) == .completed([ExtensionItem(title: "a")]))
        #expect(await rb.wait(for: b) == .completed([ExtensionItem(title: "b")]))
        #expect(pa.pid == pb.pid && pa.pid != 0)
        await alpha.shutdown()
        await beta.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func warmWorkersAndPrewarmThroughTheDaemon() async throws {
        let warm = TemporaryExtension(identifier: "com.example.warm-echo", executable: "Echo",
                                      policy: "<key>MinWarmWorkers</key><integer>1</integer>")
        defer { warm.remove() }
        let daemon = try await DaemonProcess(extraSearchPaths: [warm.root])
        defer { daemon.remove() }
        let alpha = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "alpha")
        func workers() async -> [WorkerStatus] {
            await alpha.status(of: "com.example.warm-echo")?.workers ?? []
        }
        // A spare before any request, serving no app. Until its launcher names the worker, status shows the
        // launcher's pid: wait for the pid of the process that runs Echo.
        #expect(await eventually {
            let all = await workers()
            return all.count == 1 && readSmallFile("/proc/\(all[0].pid)/comm")?.hasPrefix("Echo") == true
        })
        let spare = try #require(await workers().first)
        #expect(spare.app == nil && spare.requestsServed == 0)
        // Alpha's first request adopts it, and a new spare takes its place.
        let (id, recorder, pid) = Self.run(try alpha.extension(identifier: "com.example.warm-echo"), "first")
        #expect(await recorder.wait(for: id) == .completed([ExtensionItem(title: "first")]))
        #expect(pid.pid == spare.pid)
        #expect(await eventually {
            let all = await workers()
            return all.count == 2 && all.contains { $0.app == nil && $0.pid != spare.pid }
        })
        // prewarm() through the daemon: beta gets a ready worker of its own before its first request.
        let beta = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "beta")
        let echo = try beta.extension(identifier: "com.example.echo")
        let prewarmed = try await echo.prewarm()
        let (b, rb, pb) = Self.run(echo, "b")
        #expect(await rb.wait(for: b) == .completed([ExtensionItem(title: "b")]))
        #expect(pb.pid == prewarmed)
        await alpha.shutdown()
        await beta.shutdown()
        #expect(await daemon.stop() == 0)
    }

    @Test func requestAppNamesTheAppFromTheCommandLine() async throws {
        let daemon = try await DaemonProcess()
        defer { daemon.remove() }
        let out = "\(daemon.folder)/out"
        // A request that takes a while: the app's pool exists while its connection does (and goes with it).
        let pid = spawnProgram([sdkHostBinary, "request", "com.example.crasher", "--socket", daemon.socket, "--app", "gamma",
                                "--text", "slow:3000"], stdout: out)
        let host = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "observer")
        var pools: [PoolStatus] = []
        let seen = await eventually(timeout: 30) {
            pools = await host.status()?.extensions.first { $0.identifier == "com.example.crasher" }?.pools ?? []
            return pools.contains { $0.app == "\(getuid())/gamma" }
        }
        #expect(seen, "\(pools)")
        let json = "\(daemon.folder)/json"
        let statusPid = spawnProgram([sdkHostBinary, "status", "--json", "--socket", daemon.socket], stdout: json)
        #expect(await waitExit(statusPid) == 0)
        let text = readSmallFile(json) ?? ""
        #expect(text.contains("\"app\":\"\(getuid())/gamma\"") && text.contains("\"slowRequestsPer1000\""), "\(text)")
        #expect(await waitExit(pid) == 0)
        await host.shutdown()
        #expect(await daemon.stop() == 0)
    }
}


/// Forty app names of one uid (shared/DESIGN.md "The daemon isolates uids and apps"): the per-uid caps hold the
/// daemon to a few workers however many names a user invents, every request is still served, and the workers
/// of apps whose connections have left exit at once, not after the idle timeout.
@Suite(.serialized) struct WorkerCapTests {
    @Test func appNamesCannotMultiplyWorkersAndLeaveNoneBehind() async throws {
        let daemon = try await DaemonProcess(extraConfig: """
            <key>MaxWorkersPerUID</key><integer>3</integer>
            <key>MaxAppPoolsPerUID</key><integer>2</integer>
            """)
        defer { daemon.remove() }
        let daemonPid = daemon.pid
        var hosts: [ExtensionHost] = []
        for n in 0..<40 { hosts.append(try await ExtensionHost.connect(socketPath: daemon.socket, appName: "name\(n)")) }
        let (outcomes, most) = await withPeak(of: { childProcesses(of: daemonPid, includingZombies: false).count }) { [hosts] in
            await withTaskGroup(of: RequestOutcome.self) { group in
                for host in hosts {
                    group.addTask { await (try? host.extension(identifier: "com.example.crasher"))?.start([ExtensionItem(title: "slow:100")]).outcome ?? .interrupted(.hostShutdown) }
                }
                return await group.reduce(into: [RequestOutcome]()) { $0.append($1) }
            }
        }
        #expect(outcomes.count == 40 && outcomes.allSatisfy { if case .completed = $0 { true } else { false } },
                "\(outcomes.filter { if case .completed = $0 { false } else { true } })")
        #expect(most <= 3, "the daemon ran \(most) workers for one uid")
        for host in hosts { await host.shutdown() }
        hosts.removeAll()
        // Every app has left: their workers exit now (the idle timeout is 30 s).
        #expect(await eventually(timeout: 10) { daemon.resources.children == 0 }, "\(daemon.resources)")
        #expect(daemon.logText.contains("to make room (MaxAppPoolsPerUID 2)"), "\(daemon.logText.suffix(2000))")
        #expect(await daemon.stop() == 0)
    }
}

/// Two uids on one root daemon (shared/DESIGN.md "The daemon isolates uids and apps"): uid 65534 is a raw client
/// written in Python (an independent reader of the wire), run with setpriv. It sees its own app's workers and
/// events, and none of root's: no app name, no pid, no crash report.
@Suite(.serialized) struct UIDIsolationTests {
    static let canSwitchUser = geteuid() == 0 && access("/usr/bin/setpriv", X_OK) == 0 && python3 != nil

    @Test(.enabled(if: canSwitchUser, "needs root, setpriv and python3"))
    func anotherUIDSeesNoneOfRootsAppsWorkersEventsOrCrashes() async throws {
        let daemon = try await DaemonProcess(
            extraConfig: "<key>AllowedUIDs</key><array><integer>0</integer><integer>65534</integer></array>",
            socketMode: 0o666, folderMode: 0o755)
        defer { daemon.remove() }
        let root = try await ExtensionHost.connect(socketPath: daemon.socket, appName: "rootsecret")
        let echo = try root.extension(identifier: "com.example.echo")
        let rootWorker = echo.start([ExtensionItem(title: "warm")])
        #expect(await rootWorker.outcome == .completed([ExtensionItem(title: "warm")]))
        let rootPid = try #require(rootWorker.pid)
        writeFile("\(daemon.folder)/client.py", """
            import plistlib, socket, struct, sys, time, uuid, json
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sys.argv[1])
            def send(d):
                b = plistlib.dumps(d, fmt=plistlib.FMT_BINARY)
                s.sendall(struct.pack(">I", len(b)) + b)
            buf = b""
            def receive_until(deadline):
                global buf
                got = []
                s.settimeout(0.1)
                while time.time() < deadline:
                    try:
                        chunk = s.recv(65536)
                        if not chunk: break
                        buf += chunk
                    except socket.timeout:
                        pass
                    while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
                        n = struct.unpack(">I", buf[:4])[0]
                        got.append(plistlib.loads(buf[4:4 + n]))
                        buf = buf[4 + n:]
                return got
            send({"type": "connect", "version": \(protocolVersion), "app": "mine"})
            send({"type": "subscribe"})
            send({"type": "begin", "id": str(uuid.uuid4()).upper(), "extension": "com.example.echo",
                  "items": [{"title": "hi", "attachments": [], "userInfo": {}}]})
            print("READY", flush=True)
            seen = receive_until(time.time() + float(sys.argv[2]))
            send({"type": "status", "seq": 1})
            seen += receive_until(time.time() + 5)
            print(json.dumps(seen, default=str))
            """)
        let out = "\(daemon.folder)/client.out"
        let pid = spawnProgram(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                try #require(python3), "\(daemon.folder)/client.py", daemon.socket, "6"],
                               stdout: out, stderr: "\(daemon.folder)/client.err")
        #expect(await eventually(timeout: 30) { (readSmallFile(out) ?? "").contains("READY") })
        // While uid 65534 listens: root's app crashes a worker (events and a crash report of root's own).
        let crash = try root.extension(identifier: "com.example.crasher").start([ExtensionItem(title: "segv")])
        #expect(await crash.outcome == .interrupted(.signal(SIGSEGV)))
        let crashedPid = try #require(crash.pid)
        // Root sees both apps (while uid 65534's client is still connected: its workers go when it leaves).
        let status = try #require(await root.status())
        let apps = status.extensions.flatMap(\.workers).compactMap(\.app)
        #expect(apps.contains("0/rootsecret") && apps.contains("65534/mine"), "\(apps)")
        #expect(status.recentCrashes.contains { $0.pid == crashedPid && $0.app == "0/rootsecret" })
        #expect(await waitExit(pid) == 0, "\(readSmallFile("\(daemon.folder)/client.err") ?? "")")
        let seen = readSmallFile(out) ?? ""
        // Its own request and its own worker's events came through; root's did not, nor root's app name or pids.
        #expect(seen.contains("\"complete\"") && seen.contains("65534/mine") && seen.contains("\"spawned\""), "\(seen)")
        #expect(seen.contains("statusReport"), "\(seen)")
        // A pid as a field ("pid": N), not as digits that happen to be in an id or a time.
        func named(_ pid: pid_t) -> Bool { seen.contains("\"pid\": \(pid),") || seen.contains("\"pid\": \(pid)}") }
        #expect(!seen.contains("rootsecret") && !named(rootPid) && !named(crashedPid)
                && !seen.contains("com.example.crasher\", \"pid"), "\(seen)")
        await root.shutdown()
        #expect(await daemon.stop() == 0)
    }
}
