// greeter-app: embeds an ExtensionHost, finds the extensions of another package (GreeterExtension) by their
// manifests and executables, and uses them through the public API only.
//
//   swift build --package-path Examples/GreeterExtension
//   swift run --package-path Examples/GreeterApp greeter-app "$PWD/Examples/GreeterExtension" Ada Grace
//   ... greeter-app "$PWD/Examples/GreeterExtension" --daemon /run/sdk-host/sdk-host.sock Ada
//
// It greets each name through Greeter, then by the nickname it gives Greeter through its `nickname` host service
// (with --daemon, through that daemon as well), then lets Snoop (an untrusted SDK) try its escapes under the default
// sandbox and prints what each attempt got. Exit status 0 if every escape was refused, the controls worked and
// the host still served afterwards; 1 otherwise.
import SDKHost

#if canImport(Glibc)
import Glibc
#endif

var arguments = Array(CommandLine.arguments.dropFirst())
guard let extensionPackage = arguments.first else {
    print("usage: greeter-app <GreeterExtension folder> [--executables DIR] [name…]")
    exit(2)
}
arguments.removeFirst()
// Where the extension package's `swift build` put its executables (or --executables, for a --scratch-path build).
var executables = ["\(extensionPackage)/.build/debug", "\(extensionPackage)/.build/release"]
if arguments.first == "--executables", arguments.count > 1 {
    executables = [arguments[1]]
    arguments.removeFirst(2)
}
var daemonSocket: String?
if arguments.first == "--daemon", arguments.count > 1 {
    daemonSocket = arguments[1]
    arguments.removeFirst(2)
}

/// The app's `nickname` service: Greeter asks it for a name's nickname (the sandbox keeps the app's address
/// book from the extension; the app answers what it chooses to).
let nicknames = ["Ada": "Countess Ada", "Grace": "Amazing Grace"]
func provideNicknames(_ greeter: Extension) throws {
    try greeter.registerService("nickname") { call in
        let name = call.items.first?.title ?? ""
        return [ExtensionItem(title: nicknames[name] ?? name)]
    }
}
let names = arguments.isEmpty ? ["world"] : arguments

var configuration = HostConfiguration(extensionSearchPaths: ["\(extensionPackage)/Manifests"])
configuration.executableSearchPaths = executables
let host: ExtensionHost
do {
    host = try ExtensionHost(configuration: configuration)
} catch {
    print("greeter-app: \(error)")
    exit(2)
}
print("extensions: \(host.extensionIdentifiers.sorted().joined(separator: ", "))")

/// A TCP listener on 127.0.0.1 (an ephemeral port), for Snoop to try to reach. Traffic never leaves this machine.
func loopbackListener() -> (fd: Int32, port: UInt16) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = in_addr_t(0x7F00_0001).bigEndian
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
            bind(fd, pointer, length)
            listen(fd, 4)
            return getsockname(fd, pointer, &length)
        }
    }
    return (fd, UInt16(bigEndian: address.sin_port))
}

var ok = true
do {
    let greeter = try host.extension(identifier: "com.example.greeter")
    let replies = try await greeter.perform(names.map { ExtensionItem(title: $0) })
    for reply in replies { print("greeter: \(reply.title ?? "")") }
    ok = ok && replies.count == names.count

    // Host services: Greeter asks this app for each name's nickname.
    try provideNicknames(greeter)
    for name in names {
        let reply = try await greeter.perform([ExtensionItem(title: "nick:\(name)")])
        print("greeter via service: \(reply.first?.title ?? "")")
    }
    if let daemonSocket {
        let remote = try await ExtensionHost.connect(socketPath: daemonSocket, appName: "greeter-app")
        let remoteGreeter = try remote.extension(identifier: "com.example.greeter")
        try provideNicknames(remoteGreeter)
        for name in names {
            let reply = try await remoteGreeter.perform([ExtensionItem(title: "nick:\(name)")])
            print("greeter via service through the daemon: \(reply.first?.title ?? "")")
        }
        await remote.shutdown()
    }

    // A stream read from top-level code, left after its first result: `cancel()` ends the request (the loop's
    // iterator may live as long as the program here, so dropping it is not enough).
    let counting = greeter.stream([ExtensionItem(title: "count:50")])
    var taken = 0
    for try await batch in counting {
        taken += 1
        print("greeter stream: \(batch.first?.title ?? "")")
        break
    }
    counting.cancel()
    // Ended within a few of the worker's 100 ms steps, not after its 5 s of counting.
    var cancelled = false
    for _ in 0..<40 {
        let status = await host.status()?.extensions.first { $0.identifier == "com.example.greeter" }
        if let status, status.cancellations >= 1 {
            cancelled = true
            break
        }
        try await Task.sleep(nanoseconds: 50_000_000)
    }
    print("greeter stream: " + (cancelled ? "cancelled after \(taken) result" : "NOT CANCELLED within 2 s"))
    ok = ok && cancelled

    let snoop = try host.extension(identifier: "com.example.snoop")
    let listener = loopbackListener()
    var scratch = "/tmp/greeter-app-XXXXXX".utf8CString
    let folder = scratch.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    // A file and a Unix socket of the app's own, outside anything the manifest grants.
    let secret = "\(folder)/secret"
    close(open(secret, O_WRONLY | O_CREAT, 0o600))
    let socketPath = "\(folder)/app.sock"
    let unixListener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    var unixAddress = sockaddr_un()
    unixAddress.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &unixAddress.sun_path) { raw in
        for (i, byte) in socketPath.utf8.enumerated() { raw[i] = byte }
    }
    _ = withUnsafePointer(to: &unixAddress) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(unixListener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    listen(unixListener, 4)
    let escapes = ["shadow", "host-environ", "host-mem", "signal-host", "fork", "tcp:\(listener.port)",
                   "create:\(folder)/planted", "read:\(secret)", "unix:\(socketPath)", "shared-memory"]
    for attempt in escapes {
        let reply: String
        do {
            reply = try await snoop.perform([ExtensionItem(title: attempt)]).first?.title ?? "(no reply)"
        } catch {
            reply = "ended: \(error)"  // killing only its own worker also counts as stopped
        }
        let stopped = !reply.hasPrefix("ALLOWED") && !reply.hasPrefix("unknown")
        print("snoop \(attempt): \(reply)\(stopped ? "" : "   <-- NOT STOPPED")")
        ok = ok && stopped
    }
    let control = try await snoop.perform([ExtensionItem(title: "tmpdir")]).first?.title ?? ""
    print("snoop tmpdir (control): \(control)")
    ok = ok && control == "ALLOWED"
    close(listener.fd)
    close(unixListener)
    unlink(socketPath)
    unlink(secret)
    rmdir(folder)

    // The host still serves.
    let again = try await greeter.perform([ExtensionItem(title: "again")])
    print("greeter: \(again.first?.title ?? "")")
    ok = ok && again.first?.title?.hasSuffix(", again!") == true
} catch {
    print("greeter-app: \(error)")
    ok = false
}
await host.shutdown()
print(ok ? "greeter-app: all escapes refused, controls worked" : "greeter-app: FAILED")
exit(ok ? 0 : 1)
