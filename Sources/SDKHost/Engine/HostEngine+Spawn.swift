// Spawning a worker on the engine's loop: its environment and sandbox profile, the launch, and the watches on its
// exit, socket and output; and what a spawn needs ready (the next worker's temp folder). What happens to a worker
// afterwards is in HostEngine+Workers.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix
import CSDKShim
import Dispatch

extension HostEngine {
    /// Launches a worker. On the loop thread only: the launcher's (or an unsandboxed worker's) parent-death
    /// signal belongs to the thread that spawned it, and fires when that thread exits; the loop thread lives as
    /// long as the host, while an app's thread or the exit-notice watcher's (which ends when it has nothing to
    /// watch) may not. Engine code running inline elsewhere hands the spawn to the loop.
    func spawnWorker(_ manifest: ExtensionManifest, poolKey: String, app: String?) throws(HostError) -> WorkerProcess {
        assert(loop.onLoopThread, "a worker is spawned on the loop thread")
        if let refusal = manifest.refusal { throw refusal }
        guard let path = manifest.executablePath else {
            throw HostError(.executableNotFound, "\(manifest.identifier): executable '\(manifest.executableName)' "
                + "not found in \(manifest.searchedPaths.joined(separator: ", "))")
        }
        let idleMs = Int64(nanoseconds(manifest.policy.idleTimeoutSeconds) / 1_000_000)
        let environment = workerEnvironment(manifest, idleMs: idleMs)
        var spawn: SandboxedSpawn
        // The next worker's folder is made once this spawn is done, off the path of this request.
        defer {
            if launcherPath != nil, manifest.policy.usesWorkerFolder {
                loop.execute { [unowned self] in self.makeSpareWorkerDirectory() }
            }
        }
        let policy = manifest.policy
        let network = launcherPath != nil && policy.sandbox != .none && !policy.networkAllowed ? networkNamespaceForWorkers() : -1
        do throws(HostError) {
            let premade = policy.usesWorkerFolder ? spareWorkerDirectory : nil
            if premade != nil { spareWorkerDirectory = nil }
            spawn = try SandboxProfile.spawn(
                manifest, executable: path, environment: environment, launcher: launcherPath,
                runtimePaths: configuration.runtimePaths, worker: workerIdentity,
                temporaryBase: configuration.temporaryDirectory,
                premadeDirectory: premade, folders: workerFolders, measured: configuration.measuresSandboxLayers, networkNamespace: network,
                deviceFolder: policy.sandbox == .none ? nil : deviceFolderForWorkers(),
                rootTemplates: policy.sandbox == .none ? nil : rootTemplatesForWorkers())
        } catch {
            throw HostError(error.code, "\(manifest.identifier): \(error.detail)")
        }
        spawn.request.exitNotice = true
        if manifest.policy.sandbox == .none {
            log(.warning, "\(manifest.identifier): Sandbox is none: the worker runs unconfined")
        }
        let launched: LaunchedWorker
        do {
            launched = try launcher.launch(spawn.request)
        } catch {
            if let folder = spawn.temporaryDirectory { workerFolders.remove(folder) }
            throw HostError(.system, "\(manifest.identifier): cannot launch \(path): \(error)")
        }
        let worker = WorkerProcess(extensionID: manifest.identifier, policy: manifest.policy, poolKey: poolKey, app: app,
                                   launched: launched, loop: loop, wireLimits: configuration.wireLimits)
        worker.connection.keepsPayloads = forwardsPayloads
        // What the host has to send a worker is bounded by its policy: its requests' begins, its host calls'
        // answers, a frame each at most, and a little more. Past that it is not reading what it provokes (errors,
        // pongs): the host stops reading it (its heartbeat, unanswered, then ends it), and lets it go past that by a
        // frame, rather than hold its replies without bound.
        // (At least 4 MiB: with small frames, cancels, credits and pings could add up past a few frames.)
        let frames = manifest.policy.maxConcurrentRequests + manifest.policy.maxHostCallsInFlight + 2
        let (outputLimit, overflow) = frames.multipliedReportingOverflow(by: configuration.wireLimits.maxFrameBytes)
        worker.connection.outputLimit = overflow ? nil : max(outputLimit, 4 << 20)
        if forwardsPayloads {
            worker.connection.onForwardable = { [unowned self, unowned worker] scanned in
                self.forwardableCompletion(scanned, from: worker)
            }
        }
        worker.temporaryDirectory = spawn.temporaryDirectory
        worker.lifecycle.observer = { [metrics] t in metrics.countTransition(from: t.from, to: t.to) }
        count(manifest.identifier, \.spawns)
        workers.add(worker)
        // Through the launcher, the worker's own pid comes with its `sandboxed` frame: settled then.
        if spawn.request.profile == nil { settlePid(worker) }
        do throws(SystemError) {
            try loop.register(worker.exitFD, events: EventLoop.readable) { [unowned self, unowned worker] _ in
                self.processExited(worker)
            }
            worker.exitWatched = true
            try worker.connection.start(
                onMessage: { [unowned self, unowned worker] message in self.handle(message, from: worker) },
                onEnd: { [unowned self, unowned worker] end in
                    switch end {
                    case .badInput(let detail), .notReading(let detail): self.protocolViolation(worker, detail)
                    case .truncated(let detail): self.socketEndedMidFrame(worker, detail)
                    case .broken, .endOfFile: self.socketBroken(worker)
                    }
                })
            try loop.register(worker.stdoutFD, events: EventLoop.readable) { [unowned self, unowned worker] _ in
                self.drainPipe(worker, stderr: false)
            }
            try loop.register(worker.stderrFD, events: EventLoop.readable) { [unowned self, unowned worker] _ in
                self.drainPipe(worker, stderr: true)
            }
        } catch {
            // It cannot be supervised: kill it, and reap it by polling if its exit cannot be watched either.
            log(.error, "\(manifest.identifier): cannot watch worker \(worker.pid): \(error); killing it")
            worker.connection.close()
            kill(worker, .launchFailed("cannot watch the worker: \(error)"))
            if !worker.exitWatched { pollForExit(worker) }
            return worker
        }
        // Under a launcher this is the launcher's pid, which its 'sandboxed' report replaces with the worker's own
        // (logged then): the log said "started worker pid 3314", then "worker pid 3317 exited".
        log(.info, "\(manifest.identifier): started " + (launcherPath == nil ? "worker" : "launcher") + " pid \(worker.pid)")
        send(.hello(version: protocolVersion, identifier: manifest.identifier, hostPid: ThisProcess.id, idleTimeoutMs: idleMs),
             to: worker)
        if heartbeatTimer == nil { scheduleHeartbeat() }
        return worker
    }

    /// A worker's environment (the same for every worker of a manifest): made once per extension and kept while
    /// what it is made of stays the same (a reload may change the manifest's policy). Nine strings built for
    /// every spawn were ~1.5% of the simulation.
    func workerEnvironment(_ manifest: ExtensionManifest, idleMs: Int64) -> [String] {
        let inputs = WorkerEnvironmentInputs(
            idleMs: idleMs, leakCheckDelaySeconds: manifest.policy.leakCheckDelaySeconds,
            maxHostCallsInFlight: manifest.policy.maxHostCallsInFlight, environment: manifest.policy.environment)
        if let kept = workerEnvironments[manifest.identifier], kept.inputs == inputs { return kept.environment }
        var environment = [
            "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
            // A crashing worker should die at once; the Swift backtracer would hold the crash for ~1 s. Naming its
            // helper stops the runtime from looking for it at every start (nine stat and readlink calls, ~20 us).
            "SWIFT_BACKTRACE=enable=no,swift-backtrace=/nonexistent",
            "SDKHOST_IPC_FD=3", "SDKHOST_EXTENSION_ID=\(manifest.identifier)",
            "SDKHOST_IDLE_TIMEOUT_MS=\(idleMs)",
            "SDKHOST_LEAK_CHECK_MS=\(Int64(manifest.policy.leakCheckDelaySeconds * 1000))",
            "SDKHOST_MAX_HOST_CALLS=\(manifest.policy.maxHostCallsInFlight)",
            "SDKHOST_BUSY_POLL_US=\(configuration.busyPollMicroseconds)",
        ]
        // The exit notice (ExitNotice.swift). A sandboxed worker runs in its own pid namespace under its launcher;
        // its page is moved to its real pid when the launcher's `sandboxed` names it.
        environment.append("SDKHOST_EXIT_NOTICE_FD=\(ExitNoticePage.descriptor)")
        // Under an address-space limit every malloc arena's 64 MiB reservation counts, and glibc makes up to 8
        // per core: four arenas keep a threaded worker well inside a few hundred MiB. The config may override.
        if !configuration.workerEnvironment.contains(where: { $0.hasPrefix("MALLOC_ARENA_MAX=") }) {
            environment.append("MALLOC_ARENA_MAX=4")
        }
        environment += configuration.workerEnvironment
        if !manifest.policy.environment.isEmpty {
            // The manifest's variables replace any of the same name above (a later duplicate is not portable).
            let names = Set(manifest.policy.environment.keys)
            environment.removeAll { entry in names.contains(String(entry.prefix { $0 != "=" })) }
            environment += manifest.policy.environment.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        }
        workerEnvironments[manifest.identifier] = (inputs, environment)
        return environment
    }

    /// Reaps a worker whose exit descriptor is not in the epoll set: checks every 10 ms.
    func pollForExit(_ worker: WorkerProcess) {
        worker.reapPollTimer = loop.schedule(afterNanoseconds: 10_000_000) { [unowned self, worker] in
            guard !worker.lifecycle.phase.isOver else { return }
            worker.reapPollTimer = nil
            self.processExited(worker)
            if !worker.lifecycle.phase.isOver { self.pollForExit(worker) }
        }
    }

    /// At start: the sweep of killed hosts' folders (off the caller's thread and the loop: the temp folder may be
    /// large), and, on the loop, what this host's sandboxed spawns share, off the first request's path: the next
    /// worker's folder where one is used, the root templates' folder, the empty network namespace and the device
    /// folder (a root host's).
    func prepareSandboxResources() {
        let temporaryBase = configuration.temporaryDirectory
        if SandboxProfile.claimOrphanSweep(of: temporaryBase) {
            DispatchQueue.global(qos: .utility).async {
                SandboxProfile.removeOrphanedWorkerDirectories(in: temporaryBase)
            }
        }
        guard launcherPath != nil else { return }
        if manifests.values.contains(where: { $0.policy.usesWorkerFolder }) {
            loop.execute { [unowned self] in self.makeSpareWorkerDirectory() }
        }
        if geteuid() == 0, manifests.values.contains(where: { $0.policy.sandbox != .none }) {
            loop.execute { [unowned self] in _ = self.rootTemplatesForWorkers() }
        }
        if geteuid() == 0, manifests.values.contains(where: { $0.policy.sandbox != .none && !$0.policy.networkAllowed }) {
            loop.execute { [unowned self] in
                _ = self.networkNamespaceForWorkers()
                _ = self.deviceFolderForWorkers()
            }
        }
    }

    /// One empty network namespace for every worker without NetworkAllowed, made when the host starts (or at the
    /// first spawn that needs it) and joined by each launcher (`setns`) instead of a namespace per worker: creating one costs ~0.55 ms
    /// here, over a third of a sandboxed cold start, and tearing it down more CPU later. It has no interface
    /// but a loopback that is down, which a worker cannot bring up (no capability over it); its workers cannot
    /// reach each other through it (no bind or connect without NetworkAllowed, abstract sockets scoped by
    /// Landlock). Only a root host can make one (CAP_SYS_ADMIN); an unprivileged host's workers each get their
    /// own, as before. Returns the descriptor or -1.
    func networkNamespaceForWorkers() -> Int32 {
        if let fd = sharedNetworkNamespace { return fd }
        guard !shuttingDown else { return -1 }
        let fd = geteuid() == 0 ? sdk_make_network_namespace() : -1
        if fd < 0, geteuid() == 0 {
            log(.info, "cannot make a shared network namespace (\(String(cString: strerror(errno)))); each worker gets its own")
        }
        sharedNetworkNamespace = fd
        return fd
    }

    /// The folder of device nodes every root built here binds as /dev (`SandboxProfile.makeDeviceFolder`), made
    /// once; nil where it cannot be.
    func deviceFolderForWorkers() -> String? {
        if let folder = deviceFolder { return folder.isEmpty ? nil : folder }
        guard !shuttingDown else { return nil }
        let folder = SandboxProfile.makeDeviceFolder(in: configuration.temporaryDirectory)
        deviceFolder = folder ?? ""
        return folder
    }

    /// A root host's folder of root templates (`SandboxProfile.rootTemplateFolder`), checked once; nil where there
    /// is none (each root is then made anew).
    func rootTemplatesForWorkers() -> String? {
        if let folder = rootTemplates { return folder.isEmpty ? nil : folder }
        guard geteuid() == 0 else {
            rootTemplates = ""
            return nil
        }
        let folder = SandboxProfile.rootTemplateFolder(in: configuration.temporaryDirectory)
        if let folder {
            let count = listDirectory(folder)?.filter { !$0.hasPrefix(".") }.count ?? 0
            if count >= SandboxProfile.maxRootTemplates {
                log(.warning, "\(folder) holds \(count) root templates, the most the launcher builds: a new set of grants "
                    + "gets its root made anew at each launch (remove the folder while no host runs to start afresh)")
            }
        } else {
            log(.info, "cannot use \(configuration.temporaryDirectory)/sdk-host-roots.0 for root templates (not a folder "
                + "of root's that only root may enter); each worker's root is made anew")
        }
        rootTemplates = folder ?? ""
        return folder
    }

    /// Makes the folder the next sandboxed worker will get as its `TMPDIR`, so that its cold start does not wait
    /// for the `mkdir` (~75 us on this VM's ext4 /tmp). At most one is kept; shutdown removes it, and a host
    /// killed before that leaves it to the next host's sweep like any worker folder (its name has our pid).
    func makeSpareWorkerDirectory() {
        guard spareWorkerDirectory == nil, !shuttingDown else { return }
        do throws(HostError) {
            spareWorkerDirectory = try workerFolders.make(in: configuration.temporaryDirectory)
        } catch {
            // The next spawn makes its own and reports why it cannot.
        }
    }
}

/// What a worker's environment is made of besides the identifier and the engine's configuration (which does not
/// change): `HostEngine.workerEnvironment`'s cache is valid while these are equal.
struct WorkerEnvironmentInputs: Equatable {
    var idleMs: Int64
    var leakCheckDelaySeconds: Double
    var maxHostCallsInFlight: Int
    var environment: [String: String]
}
