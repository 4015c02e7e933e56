// Interpreted extensions (SDKHostInterpreter): a script run by an interpreter the operator listed, under the
// strict sandbox, must not make the interpreter a way out: no other program, nothing of the machine's packages
// unless granted, the rest of the sandbox as for any worker. The probe is a worker written here on the raw
// protocol (docs/PROTOCOL.md), so that it depends on no runtime: each request runs the probes and answers one
// item per probe, titled "name: result".
import HostTestSupport
import SDKHost
import SDKWire
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A raw worker: handshake, pong, and for each begin the probes' results.
let pythonProbeWorker = rawPythonWorkerPrelude + #"""
def probe(name, f):
    try: return f"{name}: {f()}"
    except BaseException as e: return f"{name}: {type(e).__name__}"
def probes(folders):
    out = [
        probe("exec", lambda: os.execv(sys.executable, [sys.executable, "-c", "pass"])),
        probe("fork", lambda: os.fork()),
        probe("passwd", lambda: len(open("/etc/passwd").read())),
        probe("sh", lambda: os.path.exists("/bin/sh") or os.path.exists("/usr/bin/sh")),
        probe("perl", lambda: os.path.exists("/usr/bin/perl")),
        probe("interpreter", lambda: os.path.exists(sys.executable)),
        probe("inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()),
        probe("uid", lambda: os.getuid() != 0),
        probe("script folder", lambda: os.path.basename(__file__) in os.listdir(os.path.dirname(__file__))),
        probe("stdlib", lambda: __import__("json").dumps([1])),
        probe("other code", lambda: os.path.exists("/usr/lib/os-release") or os.path.exists("/usr/lib/git-core")),
    ]
    for folder in folders:
        out.append(probe("packages " + folder, lambda: len(os.listdir(folder))))
    return out
while True:
    m = receive()
    if answered(m):
        pass
    elif m["type"] == "begin":
        folders = [i.get("title", "") for i in m["items"]]
        send({"type": "complete", "id": m["id"],
              "items": [{"title": line, "attachments": [], "userInfo": {}} for line in probes(folders)]})
"""#

/// Writes a Python probe extension `<folder>/Probe` whose manifest names `interpreter`; `policy` is raw XML for
/// SDKHostPolicy's body, `extra` more NSExtension keys.
func writeProbeExtension(in folder: TemporaryFolder, identifier: String, interpreter: String, policy: String = "",
                         extra: String = "") {
    chmod(folder.path, 0o755)
    mkdir("\(folder.path)/Probe", 0o755)
    writeFile("\(folder.path)/Probe/probe.py", pythonProbeWorker)
    writeFile("\(folder.path)/Probe/Info.plist", """
        <?xml version="1.0" encoding="UTF-8"?>
        <plist version="1.0"><dict>
          <key>CFBundleIdentifier</key><string>\(identifier)</string>
          <key>NSExtension</key><dict>
            <key>NSExtensionPointIdentifier</key><string>com.sdk-host.service</string>
            <key>NSExtensionExecutable</key><string>probe.py</string>
            <key>SDKHostInterpreter</key><string>\(interpreter)</string>
            \(extra)
            <key>SDKHostPolicy</key><dict>\(policy)</dict>
          </dict>
        </dict></plist>
        """)
}

/// The default python3 interpreter, when this machine has one the host lists by default.
let defaultPython = HostConfiguration.defaultInterpreters.keys.sorted().first

@Suite(.serialized) struct InterpreterTests {
    /// The machine's package folders the host hides from interpreted workers (those that exist here).
    static let machinePackageFolders = ["/usr/lib/python3/dist-packages", "/usr/local/lib/python3.11/dist-packages",
                                        "/usr/lib/python3.11/site-packages", "/usr/local/lib/python3.11/site-packages"]
        .filter { (listNames($0)?.count ?? 0) > 0 }

    func probe(_ ext: Extension, folders: [String]) async throws -> [String: String] {
        let items = try await ext.perform(folders.isEmpty ? [ExtensionItem()] : folders.map { ExtensionItem(title: $0) })
        var results: [String: String] = [:]
        for title in items.compactMap(\.title) {
            guard let colon = title.firstIndex(of: ":") else { continue }
            results[String(title[..<colon])] = String(title[title.index(after: colon)...].dropFirst())
        }
        return results
    }

    @Test(.enabled(if: defaultPython != nil))
    func anInterpretedWorkerUnderStrictHasNoWayOut() async throws {
        let folder = try TemporaryFolder()
        writeProbeExtension(in: folder, identifier: "com.example.python-probe", interpreter: defaultPython!)
        let (host, log) = try makeHost(extraSearchPaths: [folder.path])
        let ext = try host.extension(identifier: "com.example.python-probe")
        let found = try await probe(ext, folders: Self.machinePackageFolders)
        // The interpreter runs its script from its folder, with its standard library.
        #expect(found["interpreter"] == "True" && found["script folder"] == "True" && found["stdlib"] == "[1]", "\(found)")
        // Nothing else runs: no exec, no fork, no other program in the root.
        #expect(found["exec"] == "PermissionError", "\(found)")
        #expect(found["fork"] == "PermissionError", "\(found)")
        #expect(found["sh"] == "False" && found["perl"] == "False", "\(found)")
        // Nothing of the machine: no /etc/passwd, no network, not root.
        #expect(found["passwd"] == "FileNotFoundError", "\(found)")
        #expect(found["inet"] == "PermissionError", "\(found)")
        #expect(found["uid"] == "True", "\(found)")
        // The machine's packages are not there (or, inside a folder the interpreter needs, there but empty), and
        // neither is the rest of /usr/lib: the root holds what the interpreter needs in place of RuntimePaths.
        for packages in Self.machinePackageFolders {
            #expect(["0", "FileNotFoundError"].contains(found["packages \(packages)"]), "\(packages): \(found)")
        }
        #expect(found["other code"] == "False", "\(found)")
        let layers = await host.status(of: "com.example.python-probe")?.workers.first?.sandbox ?? []
        #expect(layers.contains("root") && layers.contains("seccomp"), "\(layers)\n\(log.all.joined(separator: "\n"))")
        await host.shutdown()
    }

    /// An operator who lists a folder that holds a package folder (all of /usr/lib/python3, say) still gets the
    /// package folder covered, unless it lists the package folder itself.
    @Test(.enabled(if: defaultPython != nil && (listNames("/usr/lib/python3/dist-packages")?.count ?? 0) > 0))
    func aPackageFolderInsideTheInterpretersFoldersIsCovered() async throws {
        let folder = try TemporaryFolder()
        writeProbeExtension(in: folder, identifier: "com.example.python-wider", interpreter: defaultPython!)
        for (extra, expected) in [("/usr/lib/python3", "0"),
                                  ("/usr/lib/python3/dist-packages", "\(listNames("/usr/lib/python3/dist-packages")!.count)")] {
            let (host, _) = try makeHost(extraSearchPaths: [folder.path]) {
                $0.interpreters[defaultPython!] = HostConfiguration.defaultInterpreters[defaultPython!]! + [extra]
            }
            let found = try await probe(try host.extension(identifier: "com.example.python-wider"),
                                        folders: ["/usr/lib/python3/dist-packages"])
            #expect(found["packages /usr/lib/python3/dist-packages"] == expected, "\(extra): \(found)")
            await host.shutdown()
        }
    }

    /// "Unless granted": a manifest that grants a package folder sees it.
    @Test(.enabled(if: defaultPython != nil && !InterpreterTests.machinePackageFolders.isEmpty))
    func aGrantedPackageFolderIsVisible() async throws {
        let granted = Self.machinePackageFolders[0]
        let folder = try TemporaryFolder()
        writeProbeExtension(in: folder, identifier: "com.example.python-granted", interpreter: defaultPython!,
                            policy: "<key>ReadablePaths</key><array><string>\(granted)</string></array>")
        let (host, _) = try makeHost(extraSearchPaths: [folder.path])
        let found = try await probe(try host.extension(identifier: "com.example.python-granted"), folders: [granted])
        let count = Int(found["packages \(granted)"] ?? "") ?? 0
        #expect(count == listNames(granted)?.count, "\(found)")
        await host.shutdown()
    }

    @Test func anInterpreterTheOperatorDidNotListIsRefused() async throws {
        let folder = try TemporaryFolder()
        writeProbeExtension(in: folder, identifier: "com.example.unlisted-interpreter", interpreter: "/bin/sh")
        let (host, _) = try makeHost(extraSearchPaths: [folder.path])
        #expect {
            _ = try host.extension(identifier: "com.example.unlisted-interpreter")
        } throws: { error in
            let error = error as? HostError
            return error?.code == .refused && error?.detail.contains("SDKHostInterpreter /bin/sh is not one of the operator's Interpreters") == true
                && error?.detail.contains("\(folder.path)/Probe/Info.plist") == true
        }
        // Listed by the operator, the same manifest may run (here: an interpreter that exists, as a listing).
        let (listed, _) = try makeHost(extraSearchPaths: [folder.path]) { $0.interpreters["/bin/sh"] = [] }
        #expect(throws: Never.self) { _ = try listed.extension(identifier: "com.example.unlisted-interpreter") }
        await host.shutdown()
        await listed.shutdown()
    }

    @Test func aBadInterpreterKeyIsAnErrorNamingTheKey() async throws {
        for (interpreter, extra, expected) in [
            ("python3", "", "SDKHostInterpreter: 'python3' is not an absolute path"),
            ("/usr/bin/../bin/python3", "", "is not an absolute path without '..'"),
            (defaultPython ?? "/usr/bin/python3", "",
             "ExecutableSHA256 pins an executable"),
        ] {
            let folder = try TemporaryFolder()
            let policy = expected.contains("ExecutableSHA256")
                ? "<key>ExecutableSHA256</key><string>\(String(repeating: "a", count: 64))</string>" : ""
            writeProbeExtension(in: folder, identifier: "com.example.bad-interpreter", interpreter: interpreter,
                                policy: policy, extra: extra)
            let (host, log) = try makeHost(extraSearchPaths: [folder.path])
            #expect(log.contains("\(folder.path)/Probe/Info.plist"))
            #expect {
                _ = try host.extension(identifier: "com.example.bad-interpreter")
            } throws: { error in
                (error as? HostError)?.code == .invalidManifest && (error as? HostError)?.detail.contains(expected) == true
            }
            await host.shutdown()
        }
    }

    /// A script that is a link out of its folder would have the host bind whatever folder it points into; a module
    /// beside the script that others may write could be changed under it. Both are refused, naming the file.
    @Test(.enabled(if: defaultPython != nil))
    func aScriptLinkedOutOfItsFolderOrAWritableModuleIsRefused() async throws {
        let elsewhere = try TemporaryFolder()
        writeFile("\(elsewhere.path)/secret.py", "print('not the extension's')\n")
        let linked = try TemporaryFolder()
        writeProbeExtension(in: linked, identifier: "com.example.linked-script", interpreter: defaultPython!)
        unlink("\(linked.path)/Probe/probe.py")
        symlink("\(elsewhere.path)/secret.py", "\(linked.path)/Probe/probe.py")
        let writable = try TemporaryFolder()
        writeProbeExtension(in: writable, identifier: "com.example.writable-module", interpreter: defaultPython!)
        writeFile("\(writable.path)/Probe/helper.py", "x = 1\n")
        chmod("\(writable.path)/Probe/helper.py", 0o666)
        let (host, _) = try makeHost(extraSearchPaths: [linked.path, writable.path])
        for (id, expected) in [("com.example.linked-script", "is a link out of its manifest's folder"),
                               ("com.example.writable-module", "\(writable.path)/Probe/helper.py is writable by others")] {
            #expect {
                _ = try host.extension(identifier: id)
            } throws: { error in
                (error as? HostError)?.code == .refused && (error as? HostError)?.detail.contains(expected) == true
            }
        }
        await host.shutdown()
    }
}
