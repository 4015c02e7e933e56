// Crasher (com.example.crasher): the crash-injection extension. The first input item's title (or its first
// string attachment) picks the fault; every fault is real: a real signal, a real exit, real garbage on the wire.
#if canImport(Glibc)
import Glibc
#endif
import SDKExtension
import SDKWire  // Crasher forges wire messages on purpose (garbage, unknown ids, forged leak reports)
import CSDKShim  // and exit notices
import Synchronization

/// Half a frame on the host connection, past the runtime: a header promising 100 bytes, then 10 of them.
func writeHalfAFrame() {
    let partial: [UInt8] = [0, 0, 0, 100] + Array("bplist00xx".utf8)
    _ = partial.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
}

/// What `leak:` keeps.
enum Leak {
    static let chunks = Mutex<[[UInt8]]>([])
    /// Contexts kept for good by "hoard": the leak the runtime's check reports.
    static let contexts = Mutex<[ExtensionContext]>([])
}

@main
struct Crasher: RequestHandler {
    /// CRASHER_FAULT_AT_START=abort makes the worker die before the handshake (tests of a crash at launch), `exit0`
    /// exit 0 then, `exit0-later` exit 0 just after it (half a second after start);
    /// `abort-while:<path>` only while that file exists (a crash loop a test can end); `truncate-abort-once:<path>`
    /// half a frame then abort, in the one worker that removes that file; `sleep:<ms>` starts slowly.
    init() {
        guard let raw = getenv("CRASHER_FAULT_AT_START") else { return }
        let fault = String(cString: raw)
        if fault == "abort" { abort() }
        if fault == "exit0" { exit(0) }
        // `exit0-later`: exit 0 half a second after start (after the runtime's handshake, but on a loaded machine),
        // with nothing asked of it; `_exit`, not running exit handlers beside the runtime's threads.
        if fault == "exit0-later" {
            var thread = pthread_t()
            pthread_create(&thread, nil, { _ in
                usleep(500_000)
                _exit(0)
            }, nil)
        }
        if fault.hasPrefix("abort-while:"), access(String(fault.dropFirst(12)), F_OK) == 0 { abort() }
        // `truncate-abort-once:<path>`: the one worker that removes that file writes half a frame and aborts, before
        // its handshake (a crash at launch cut short what it was writing).
        if fault.hasPrefix("truncate-abort-once:"), unlink(String(fault.dropFirst(20))) == 0 {
            writeHalfAFrame()
            abort()
        }
        // `welcome-v1`: a welcome of protocol 1 before the runtime's own, as an extension built against the old SDK
        // would answer.
        if fault == "welcome-v1" {
            var encoder = BinaryPlistEncoder()
            var frame: [UInt8] = []
            try? Frame.encode(Message.welcome(version: 1, identifier: "com.example.crasher", pid: getpid()).plist,
                              with: &encoder, appendingTo: &frame)
            _ = frame.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
        }
        // `call-early`: a host call before the handshake (no request can be running yet).
        if fault == "call-early" {
            var encoder = BinaryPlistEncoder()
            var frame: [UInt8] = []
            try? Frame.encode(Message.hostCall(id: RequestID(), call: 1, service: "document.part", items: []).plist,
                              with: &encoder, appendingTo: &frame)
            _ = frame.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
        }
        // `pingflood`: 100,000 pings before the handshake, then never a read: the host must not queue a pong for
        // each (what it sends a worker that does not read stays in its memory).
        if fault == "pingflood" {
            var encoder = BinaryPlistEncoder()
            var frames: [UInt8] = []
            for seq in 0..<100_000 {
                try? Frame.encode(Message.ping(seq: Int64(seq)).plist, with: &encoder, appendingTo: &frames)
            }
            var sent = 0
            while sent < frames.count {
                let n = frames.withUnsafeBytes { write(3, $0.baseAddress! + sent, $0.count - sent) }
                if n <= 0 { break }
                sent += n
            }
            while true { sleep(60) }
        }
        // `sleep:<ms>`: a slow start, so that a test can kill the worker before its handshake for certain.
        if fault.hasPrefix("sleep:"), let ms = UInt32(fault.dropFirst(6)) { usleep(ms * 1000) }
    }

    /// CRASHER_INLINE=1 runs the faults on the runtime's reader thread (tests of what an inline handler's crash
    /// takes with it).
    static var runsInline: Bool { getenv("CRASHER_INLINE") != nil }

    func beginRequest(with context: ExtensionContext) {
        let command = context.inputItems.first.flatMap { $0.title ?? $0.attachments.first?.stringValue } ?? "echo"
        switch command {
        case "segv":
            UnsafeMutablePointer<Int>(bitPattern: 0x8)!.pointee = 1
        case "abort":
            abort()
        case "range":
            // The Swift analogue of NSRangeException: an index past the end traps.
            let values = [Int](repeating: 0, count: Int(getpid() % 2) + 1)
            _ = values[values.count + 1]
        case "exit":
            exit(7)
        case "notice-fake":
            // Marks its own exit-notice word as if it had died, and wakes the host's watcher, then lives on.
            if let word = exitNoticeWord() {
                let old = sdk_atomic_load_u32(word)
                _ = sdk_atomic_cas_u32(word, old, (old & 0x8000_0000) | 0x4000_0000)
                sdk_futex_wake_shared(word)
            }
            context.completeRequest(returningItems: context.inputItems)
        case let wake where wake.hasPrefix("notice-wake:"):
            // Wakes the host's watcher `n` times without changing its word, 0.5 ms apart.
            if let word = exitNoticeWord() {
                for _ in 0..<(Int(wake.dropFirst(12)) ?? 0) {
                    sdk_futex_wake_shared(word)
                    usleep(500)
                }
            }
            context.completeRequest(returningItems: context.inputItems)
        case "kill":
            kill(getpid(), SIGKILL)
        case "hang":
            // Ignores cancellation on purpose: the host must kill us.
            while true { sleep(60) }
        case "garbage":
            // Bypasses the runtime and writes bytes that are not a frame to the host connection (fd 3).
            let junk: [UInt8] = [0, 0, 0, 12] + Array("not a bplist".utf8)
            _ = junk.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
            while true { sleep(60) }
        case "oversize":
            // A frame header claiming 1 GiB: the host must reject it before reading or allocating the payload.
            let header: [UInt8] = [0x40, 0, 0, 0]
            _ = header.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
            while true { sleep(60) }
        case "truncate":
            // Half a frame (a header promising 100 bytes, then 10), then exit: the host must call it a protocol
            // violation, not a plain exit.
            writeHalfAFrame()
            exit(0)
        case "truncate-linger":
            // Half a frame, then its socket shut for writing, and it lives on: a truncated frame of its own.
            writeHalfAFrame()
            shutdown(3, Int32(SHUT_WR))
            while true { sleep(60) }
        case "truncate-segv":
            // Half a frame, then a crash, as a worker that dies while it writes: the signal is the cause, not the
            // frame it cut short.
            writeHalfAFrame()
            UnsafeMutablePointer<Int>(bitPattern: 0x8)!.pointee = 1
        case "unknownid":
            // A well-formed completion for a request this worker was never given.
            var encoder = BinaryPlistEncoder()
            var frame: [UInt8] = []
            try? Frame.encode(Message.complete(id: RequestID(), items: []).plist, with: &encoder, appendingTo: &frame)
            _ = frame.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
            while true { sleep(60) }
        case _ where command.hasPrefix("stream-abort:"):
            // N partial results, then a crash: the host must hand all N to the app, then the interruption.
            let count = Int(command.dropFirst(13)) ?? 1
            for index in 0..<count { context.send([ExtensionItem(title: "partial \(index)")]) }
            abort()
        case "flood":
            // 40 partial results in one write, ignoring the host's credit (the runtime would wait after 16): the
            // host must call it a protocol violation, not buffer them.
            var encoder = BinaryPlistEncoder()
            var frames: [UInt8] = []
            for index in 0..<40 {
                try? Frame.encode(Message.partial(id: context.requestID, items: [ExtensionItem(title: "flood \(index)")]).plist,
                                  with: &encoder, appendingTo: &frames)
            }
            _ = frames.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
            while true { sleep(60) }
        case "call-after-end":
            // Completes, then a call for the request it just completed: what a handler's stray thread may send as
            // the request ends. The host answers that the request has ended, and the worker serves on.
            context.completeRequest(returningItems: [ExtensionItem(title: "done")])
            usleep(50_000)
            var encoder = BinaryPlistEncoder()
            var frame: [UInt8] = []
            try? Frame.encode(Message.hostCall(id: context.requestID, call: 1, service: "document.part", items: []).plist,
                              with: &encoder, appendingTo: &frame)
            _ = frame.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
        case "call-other", "call-reuse", "call-zero", "call-flood":
            // Host calls that break the rules, written past the runtime: for a request this worker does not run,
            // a call number used twice, a call numbered 0, and 17 calls at once (MaxHostCallsInFlight is 16 unless
            // the manifest says).
            var encoder = BinaryPlistEncoder()
            var frames: [UInt8] = []
            let calls: [(RequestID, Int64)] = command == "call-other" ? [(RequestID(), Int64(1))]
                : command == "call-reuse" ? [(context.requestID, Int64(7)), (context.requestID, Int64(7))]
                : command == "call-zero" ? [(context.requestID, Int64(0))]
                : (1...17).map { (context.requestID, Int64($0)) }
            for (id, call) in calls {
                try? Frame.encode(Message.hostCall(id: id, call: call, service: "document.part",
                                                   items: [ExtensionItem(title: "hold-\(call)")]).plist,
                                  with: &encoder, appendingTo: &frames)
            }
            _ = frames.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
            while true { sleep(60) }
        case "call-unlisted-flood":
            // 20,000 host calls to a service the manifest does not list, each named with 1 KB, and never a read
            // (inline, on the runtime's reader): the host answers each with an error that names the service.
            var encoder = BinaryPlistEncoder()
            let service = String(repeating: "s", count: 1024)
            for batch in 0..<200 {
                var frames: [UInt8] = []
                for k in 1...100 {
                    try? Frame.encode(Message.hostCall(id: context.requestID, call: Int64(batch * 100 + k), service: service,
                                                       items: []).plist, with: &encoder, appendingTo: &frames)
                }
                var sent = 0
                while sent < frames.count {
                    let n = frames.withUnsafeBytes { write(3, $0.baseAddress! + sent, $0.count - sent) }
                    if n <= 0 { while true { sleep(60) } }
                    sent += n
                }
            }
            while true { sleep(60) }
        case "fd-pipe":
            // A pipe as a "file" attachment: a reader could block on it for good, so the host must refuse it.
            var fds: [Int32] = [-1, -1]
            guard pipe(&fds) == 0 else { abort() }
            close(fds[1])
            context.completeRequest(returningItems: [ExtensionItem(fileAttachments: [FileAttachment(adopting: fds[0])])])
        case "fd-writable", "fd-opath", "fd-unsealed":
            // Attachments that are not read-only snapshots: a file open for writing, an O_PATH descriptor, and a
            // memfd the worker could still change after the host read it. The host must refuse each.
            var fd: Int32
            if command == "fd-unsealed" {
                fd = sdk_memfd("unsealed")
                _ = write(fd, "changeable", 10)
            } else {
                let path = (getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp") + "/crasher-attachment"
                fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
                if command == "fd-opath" {
                    close(fd)
                    fd = sdk_open_path_only(path)
                }
            }
            guard fd >= 0 else { abort() }
            context.completeRequest(returningItems: [ExtensionItem(fileAttachments: [FileAttachment(adopting: fd)])])
        case "fd-count":
            // How many descriptors this worker has open, and the input's file attachments' sizes: a test checks
            // that nothing received is kept after a request.
            let targets = FileManagerless.descriptorTargets()
            let sizes = context.inputItems.flatMap(\.fileAttachments).map { PlistValue.integer(Int64($0.size)) }
            context.completeRequest(returningItems: [ExtensionItem(
                title: "\(targets.count)", text: targets.joined(separator: " "), attachments: sizes)])
        case "cancel":
            context.cancelRequest(withError: ExtensionError(
                domain: "com.example.crasher", code: 42, message: "cancelled by the extension on request"))
        case "double":
            // A buggy runtime would send a second completion: the first and a duplicate go out raw, in one write,
            // to prove the host keeps the first and drops the rest. (Written after `completeRequest`, a raw
            // duplicate could overtake the runtime's own completion, which another thread may still be about to
            // write.) The runtime's completion then comes third, and is dropped too.
            var encoder = BinaryPlistEncoder()
            var frames: [UInt8] = []
            for title in ["first", "duplicate"] {
                try? Frame.encode(Message.complete(id: context.requestID, items: [ExtensionItem(title: title)]).plist,
                                  with: &encoder, appendingTo: &frames)
            }
            _ = frames.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
            context.completeRequest(returningItems: [ExtensionItem(title: "first")])
            context.completeRequest(returningItems: [ExtensionItem(title: "second")])  // runtime: logged no-op
        case let slow where slow.hasPrefix("slow:"):
            let ms = Int(slow.dropFirst(5)) ?? 100
            var waited = 0
            while waited < ms {
                if context.isCancelled {
                    context.cancelRequest(withError: .cancelledByHost)
                    return
                }
                usleep(10_000)
                waited += 10
            }
            context.completeRequest(returningItems: context.inputItems)
        case let alloc where alloc.hasPrefix("alloc:"):
            // Allocates and touches <MB> megabytes: past the manifest's MemoryLimitMB the allocation fails and
            // the runtime traps, so the limit shows up as a crash, not as a worker that grows without bound.
            let megabytes = Int(alloc.dropFirst(6)) ?? 64
            var chunks: [[UInt8]] = []
            for _ in 0..<megabytes { chunks.append([UInt8](repeating: 1, count: 1 << 20)) }
            context.completeRequest(returningItems: [ExtensionItem(title: "allocated \(chunks.count) MB")])
        case let leak where leak.hasPrefix("leak:"):
            // Allocates, touches and keeps <MB> megabytes for the life of the worker: a leaky SDK.
            let megabytes = Int(leak.dropFirst(5)) ?? 64
            for _ in 0..<megabytes { Leak.chunks.withLock { $0.append([UInt8](repeating: 1, count: 1 << 20)) } }
            context.completeRequest(returningItems: [ExtensionItem(title: "leaked \(megabytes) MB")])
        case let big where big.hasPrefix("bigreply:"):
            // Replies with an attachment of <MB> megabytes: past the frame limit the runtime cannot send it.
            let megabytes = Int(big.dropFirst(9)) ?? 17
            context.completeRequest(returningItems: [
                ExtensionItem(attachments: [.data([UInt8](repeating: 7, count: megabytes << 20))])
            ])
        case "deepreply":
            // A reply nested past the frame's 512 levels: no frame can hold it, and the runtime says so.
            var deep = PlistValue.array([])
            for _ in 0..<520 { deep = .array([deep]) }
            context.completeRequest(returningItems: [ExtensionItem(attachments: [deep])])
        case let flood where flood.hasPrefix("flood:"):
            // <MB> megabytes of stdout, many lines, some forging a host log line and a terminal escape.
            let megabytes = Int(flood.dropFirst(6)) ?? 16
            let line = Array("sdk-host: error: forged by the extension \u{1B}[2J\r\n".utf8) + Array(repeating: 0x61, count: 200) + [0x0A]
            var block: [UInt8] = []
            while block.count < 1 << 20 { block += line }
            for _ in 0..<megabytes { _ = block.withUnsafeBytes { write(1, $0.baseAddress, $0.count) } }
            context.completeRequest(returningItems: context.inputItems)
        case let forge where forge.hasPrefix("forge:"):
            // A completion for another request's id (one this worker was never given), then carry on.
            if let other = RequestID(uuidString: String(forge.dropFirst(6))) {
                var encoder = BinaryPlistEncoder()
                var frame: [UInt8] = []
                try? Frame.encode(Message.complete(id: other, items: [ExtensionItem(title: "forged")]).plist,
                                  with: &encoder, appendingTo: &frame)
                _ = frame.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
            }
            while true { sleep(60) }
        case "stall":
            // Half a frame on the connection, then stopped: wedged mid-frame, it can answer nothing.
            writeHalfAFrame()
            kill(getpid(), SIGSTOP)
        case "pong-forge":
            // Hung (this handler, inline on the runtime's reader, sleeps for good), but a thread of its own sends a
            // pong that answers no ping (seq -1) every 50 ms: the host must still see the heartbeats missed.
            var thread = pthread_t()
            pthread_create(&thread, nil, { _ in
                var encoder = BinaryPlistEncoder()
                while true {
                    var frame: [UInt8] = []
                    try? Frame.encode(Message.pong(seq: -1).plist, with: &encoder, appendingTo: &frame)
                    _ = frame.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
                    usleep(50_000)
                }
            }, nil)
            while true { sleep(60) }
        case "stop":
            // Stops itself: it answers nothing, heartbeats included, and cannot honour a cancel.
            kill(getpid(), SIGSTOP)
        case let text where text.hasPrefix("print:"):
            // Plain print() to stdout, then complete: the line must reach the host log even though stdout is a pipe.
            print(text.dropFirst(6))
            context.completeRequest(returningItems: context.inputItems)
        case "fakeleaks":
            // 1000 forged leak reports for ids the host never sent, with oversized names: a worker inflating
            // its leak count and the host's log. Then it completes.
            var encoder = BinaryPlistEncoder()
            var frames: [UInt8] = []
            let name = String(repeating: "x\u{1B}[2J", count: 200)
            for _ in 0..<1000 {
                try? Frame.encode(Message.leak(id: RequestID(), alive: [name, name, name, name, name], afterMs: -1).plist,
                                  with: &encoder, appendingTo: &frames)
            }
            _ = frames.withUnsafeBytes { write(3, $0.baseAddress, $0.count) }
            context.completeRequest(returningItems: context.inputItems)
        case "hoard":
            // Keeps every request's context in a global array: an SDK that caches what it should not.
            Leak.contexts.withLock { $0.append(context) }
            context.completeRequest(returningItems: context.inputItems)
        case let name where name.hasPrefix("env:"):
            // The value of one environment variable ("(unset)" if it is not set): what the host passed.
            let value = getenv(String(name.dropFirst(4))).map { String(cString: $0) } ?? "(unset)"
            context.completeRequest(returningItems: [ExtensionItem(title: value)])
        case "stderr":
            // Writes to stderr, then crashes: the crash report must carry the text.
            let text = "crasher: about to abort on request\n"
            _ = text.withCString { write(2, $0, strlen($0)) }
            abort()
        default:  // "echo" and anything unknown
            context.completeRequest(returningItems: context.inputItems)
        }
    }
}

/// This process's open descriptors, without Foundation.
enum FileManagerless {
    /// "fd=target" for each open descriptor but the one listing them.
    static func descriptorTargets() -> [String] {
        guard let dir = opendir("/proc/self/fd") else { return [] }
        defer { closedir(dir) }
        let own = dirfd(dir)
        var out: [String] = []
        while let entry = readdir(dir) {
            // The name where it lies: copying all of `entry.pointee` could read past the kernel's (shorter) record.
            let name = String(cString: (UnsafeRawPointer(entry) + MemoryLayout<dirent>.offset(of: \dirent.d_name)!)
                .assumingMemoryBound(to: CChar.self))
            guard let fd = Int32(name), fd != own else { continue }
            var buffer = [CChar](repeating: 0, count: 256)
            let n = readlink("/proc/self/fd/\(name)", &buffer, 255)
            out.append("\(name)=" + (n > 0 ? String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?"))
        }
        return out
    }
}

/// The exit-notice word the runtime registered: the first word of the page mapped from the host's memfd, found in
/// /proc/self/maps as a hostile extension would find it.
func exitNoticeWord() -> UnsafeMutablePointer<UInt32>? {
    guard let file = fopen("/proc/self/maps", "r") else { return nil }
    defer { fclose(file) }
    var line = [CChar](repeating: 0, count: 512)
    while fgets(&line, Int32(line.count), file) != nil {
        let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard text.contains("sdk-host-exit-notice"), let dash = text.firstIndex(of: "-"),
            let start = UInt(text[..<dash], radix: 16)
        else { continue }
        return UnsafeMutablePointer(bitPattern: start)
    }
    return nil
}
