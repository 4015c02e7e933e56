// `sdk-host doctor [--json]`: which sandbox layers this machine offers, and why not. It runs the launcher in
// its `--doctor` mode, which tries each layer in a throwaway child process, so the answer is the kernel's own.
// Exit 0 when every layer the default profile (Sandbox = strict) needs is available, 1 otherwise.
import SDKHost

#if canImport(Glibc)
import Glibc
#endif

enum DoctorCommand {
    static let usage = "usage: sdk-host doctor [--json]"
    /// What a strict worker needs; the namespaces matter only to extensions with AllowSubprocesses.
    static let requiredByDefault = ["noNewPrivs", "capabilities", "landlock", "seccomp", "rlimits"]

    static func run(_ arguments: [String]) -> Never {
        let options = Options(arguments, valued: [], boolean: ["--json"], usage: usage)
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
        if options.has("--json") {
            let value: PlistValue = [
                "launcher": .string(launcher), "uid": .integer(Int64(geteuid())),
                "layers": .array(rows.map { ["name": .string($0.name), "available": .bool($0.available), "detail": .string($0.detail)] }),
                "strictReady": .bool(missing.isEmpty),
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
        }
        exit(missing.isEmpty ? 0 : 1)
    }
}
