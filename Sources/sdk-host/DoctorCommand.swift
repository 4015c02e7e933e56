// `sdk-host doctor [--json]`: which sandbox layers this machine offers, and why not. It runs the launcher in
// its `--doctor` mode, which tries each layer in a throwaway child process, so the answer is the kernel's own.
// Exit 0 when every layer the default profile (Sandbox = strict) needs is available, 1 otherwise.
import SDKDaemon
import SDKHost
import SDKPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

enum DoctorCommand {
    static let usage = """
        usage: sdk-host doctor [--json] [--config PATH] [--socket PATH]
          Kernel features and sandbox layers (each tried in a throwaway child), the configuration and its
          extensions (manifests, executables), and the daemon's socket. Exit 0 when the default sandbox can launch
          workers and the configuration and every manifest load, 2 when the configuration or a manifest does not,
          1 otherwise.
        """
    /// What a strict worker needs; the namespaces matter only to extensions with AllowSubprocesses.
    static let requiredByDefault = ["noNewPrivs", "capabilities", "landlock", "seccomp", "rlimits"]

    static func run(_ arguments: [String]) -> Never {
        let options = Options(arguments, valued: ["--config", "--socket"], boolean: ["--json"], usage: usage)
        guard let launcher = SandboxProfile.findLauncher(configured: nil, searchPaths: []) else {
            fail("doctor: sdk-host-launcher not found next to \(currentExecutableDirectory() ?? "this executable"); "
                + "build it with `swift build`", status: 1)
        }
        let escaped = launcher.replacing("'", with: "'\\''")
        guard let pipe = popen("'\(escaped)' --doctor", "r") else { fail("doctor: cannot run \(launcher)", status: 1) }
        var output: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = fread(&chunk, 1, chunk.count, pipe)
            if n == 0 { break }
            output += chunk[0..<n]
        }
        guard pclose(pipe) == 0 else { fail("doctor: \(launcher) --doctor failed", status: 1) }
        let rows = String(decoding: output, as: UTF8.self).split(separator: "\n").map { line in
            let fields = line.split(separator: "\t", maxSplits: 2).map(String.init)
            return (name: fields.first ?? "?", available: fields.count > 1 && fields[1] == "yes",
                    detail: fields.count > 2 ? fields[2] : "")
        }
        let missing = requiredByDefault.filter { name in !rows.contains { $0.name == name && $0.available } }
        let setup = checkSetup(options)
        if options.has("--json") {
            let value: PlistValue = [
                "launcher": .string(launcher), "uid": .integer(Int64(geteuid())),
                "layers": .array(rows.map { ["name": .string($0.name), "available": .bool($0.available), "detail": .string($0.detail)] }),
                "strictReady": .bool(missing.isEmpty),
                "checks": .array(setup.map { ["name": .string($0.name), "ok": .bool($0.ok), "detail": .string($0.detail)] }),
            ]
            print(JSON.render(value))
        } else {
            var name = utsname()
            uname(&name)
            let release = withUnsafeBytes(of: name.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            print("sandbox layers on this machine (Linux \(release), uid \(geteuid())), tried by \(launcher):")
            for row in rows {
                print("  " + StatusCommand.pad(row.name, 16) + StatusCommand.pad(row.available ? "yes" : "NO", 5) + row.detail)
            }
            if missing.isEmpty {
                print("Sandbox = strict (the default) can launch workers here.")
            } else {
                print("Sandbox = strict cannot launch workers here: \(missing.joined(separator: ", ")) unavailable. "
                    + "Use Sandbox = bestEffort to run with what the kernel offers.")
            }
            print("setup:")
            for check in setup {
                print("  " + StatusCommand.pad(check.name, 16) + StatusCommand.pad(check.ok ? "ok" : "NO", 5) + check.detail)
            }
        }
        // A configuration that does not load, or a manifest the host skips, is a configuration error (2), as for
        // every other command.
        if setup.contains(where: { ($0.name == "configuration" || $0.name == "manifests") && !$0.ok }) { exit(ExitStatus.usage) }
        exit(missing.isEmpty && setup.allSatisfy(\.ok) ? ExitStatus.success : ExitStatus.failure)
    }

    /// The configuration loads, its extensions load and have executables, and the socket's folder is usable.
    /// A daemon that is not running is not a failure: only reported.
    static func checkSetup(_ options: Options) -> [(name: String, ok: Bool, detail: String)] {
        var checks: [(name: String, ok: Bool, detail: String)] = []
        let path = configurationFile(options)
        let configuration: DaemonConfiguration
        do {
            configuration = try readConfiguration(path)
            checks.append(("configuration", true, path ?? "built-in defaults"))
        } catch {
            checks.append(("configuration", false, "\(error)"))
            return checks
        }
        var host = configuration.host
        // A manifest the host skips (ill-formed, or a second one of an identifier) is logged, not thrown: kept.
        let skipped = Mutex<[String]>([])
        host.logHandler = { level, line in
            if level >= .error, line.hasSuffix(HostEngine.skippedManifestSuffix) { skipped.withLock { $0.append(line) } }
        }
        do {
            let embedded = try ExtensionHost(configuration: host)
            let infos = embedded.extensions
            var missing: [String] = []
            for info in infos {
                do { _ = try embedded.extension(identifier: info.identifier) } catch { missing.append("\(error)") }
            }
            embedded.shutdown {}
            // A skipped manifest that names its identifier was refused by name just above: said once.
            missing += skipped.withLock { $0 }.filter { line in !missing.contains { line.hasPrefix($0) } }
            checks.append(("extensions", missing.isEmpty && !infos.isEmpty,
                           !missing.isEmpty ? missing.joined(separator: "; ")
                               : infos.isEmpty ? "none found in \(host.extensionSearchPaths.joined(separator: ", "))"
                               : infos.map(\.description).joined(separator: ", ")))
            if !skipped.withLock({ $0.isEmpty }) { checks.append(("manifests", false, "a manifest is skipped (above)")) }
        } catch {
            checks.append(("extensions", false, "\(error)"))
        }
        let socket = options.value("--socket") ?? configuration.socketPath
        let folder = String(socket[..<(socket.lastIndex(of: "/") ?? socket.startIndex)])
        var st = stat()
        if stat(folder.isEmpty ? "." : folder, &st) == 0 {
            let safe = (st.st_uid == geteuid() || st.st_uid == 0) && st.st_mode & 0o022 == 0
            checks.append(("socket folder", safe, "\(folder) " + (safe ? "belongs to uid \(st.st_uid), not writable by others"
                : "must belong to you or root and not be writable by group or others (mode \(String(st.st_mode & 0o777, radix: 8)))")))
        } else {
            checks.append(("socket folder", true, "\(folder) does not exist yet; `serve` creates it (mode 700)"))
        }
        var answering = false
        if let fd = try? connectUnix(path: socket) {
            fd.close()
            answering = true
        }
        checks.append(("daemon", true, answering ? "answering on \(socket)" : "not running on \(socket) (not an error)"))
        return checks
    }
}
