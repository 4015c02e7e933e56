// `sdk-host hammer --socket P --count N [--faults K] [--in-flight M] [--sample]`: a load client for tests and soak runs.
// Sends N echo requests to com.example.echo, M at a time, plus K segv requests to com.example.crasher, through
// the daemon; prints one JSON line: how each ended, duplicates (must be 0), and echo replies that differed.
import Dispatch
import SDKHost
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

enum HammerCommand {
    static let usage = "usage: sdk-host hammer --socket PATH --count N [--faults K] [--in-flight M] [--sample]"

    final class Tally: Sendable {
        let state = Mutex<(callbacks: [RequestID: Int], completed: Int, cancelled: Int, interrupted: Int, wrongEcho: Int)>(([:], 0, 0, 0, 0))
    }

    static func run(_ arguments: [String]) -> Never {
        let options = Options(arguments, valued: ["--socket", "--count", "--faults", "--in-flight"], boolean: ["--sample"],
                              usage: usage)
        guard let socket = options.value("--socket"), let count = options.value("--count").flatMap(Int.init) else {
            fail("--socket and --count are required", status: 2, usage: usage)
        }
        let faults = options.value("--faults").flatMap(Int.init) ?? 0
        let width = options.value("--in-flight").flatMap(Int.init) ?? 64
        // `--sample`: each echo carries the bench's 300-byte item (its title replaced), not a bare title.
        let template = options.has("--sample") ? EmbeddedBench.item : ExtensionItem()
        let connected: ExtensionHost? = runAsync { try? await ExtensionHost.connect(socketPath: socket) }
        guard let host = connected, let echo = try? host.extension(identifier: "com.example.echo"),
            let crasher = try? host.extension(identifier: "com.example.crasher")
        else { fail("hammer: cannot reach the daemon at \(socket)", status: 2) }
        let tally = Tally()
        let slots = DispatchSemaphore(value: width)
        let all = DispatchGroup()
        let expected = Mutex<[RequestID: String]>([:])
        let prefix = "m\(getpid())-"  // once: glibc does not cache the pid, and a syscall per request skews the load
        func install(_ ext: Extension) {
            ext.requestCompletionHandler = { id, items in
                // Echo replies must carry this process's text; when the reply beats the bookkeeping below,
                // only the per-process prefix can be checked.
                let want = expected.withLock { $0[id] }
                let title = items.first?.title
                tally.state.withLock {
                    $0.callbacks[id, default: 0] += 1
                    $0.completed += 1
                    if let want, title != want { $0.wrongEcho += 1 }
                    if want == nil, title != "segv", title?.hasPrefix(prefix) != true { $0.wrongEcho += 1 }
                }
                slots.signal()
                all.leave()
            }
            ext.requestCancellationHandler = { id, _ in
                tally.state.withLock { $0.callbacks[id, default: 0] += 1; $0.cancelled += 1 }
                slots.signal()
                all.leave()
            }
            ext.requestInterruptionHandler = { id, _ in
                tally.state.withLock { $0.callbacks[id, default: 0] += 1; $0.interrupted += 1 }
                slots.signal()
                all.leave()
            }
        }
        install(echo)
        install(crasher)
        let faultEvery = faults > 0 ? max(1, count / faults) : Int.max
        var sent: [RequestID] = []
        var faultsSent = 0
        for i in 0..<count {
            slots.wait()
            all.enter()
            let text = "\(prefix)\(i)"
            var item = template
            item.title = text
            let rid = echo.beginRequest(withInputItems: [item])
            expected.withLock { $0[rid] = text }
            sent.append(rid)
            if i % faultEvery == faultEvery - 1 && faultsSent < faults {
                slots.wait()
                all.enter()
                sent.append(crasher.beginRequest(withInputItems: [ExtensionItem(title: "segv")]))
                faultsSent += 1
            }
        }
        all.wait()
        usleep(200_000)  // time for stray duplicates to arrive (there must be none)
        let s = tally.state.withLock { $0 }
        let duplicates = s.callbacks.values.filter { $0 > 1 }.count
        let missing = sent.filter { s.callbacks[$0] == nil }.count
        print("{\"sent\":\(sent.count),\"faults\":\(faultsSent),\"completed\":\(s.completed),\"cancelled\":\(s.cancelled),"
            + "\"interrupted\":\(s.interrupted),\"duplicates\":\(duplicates),\"missing\":\(missing),\"wrongEcho\":\(s.wrongEcho)}")
        let done = DispatchSemaphore(value: 0)
        host.shutdown { done.signal() }
        done.wait()
        exit(0)
    }
}
