// `sdk-host request <ext-id> [--text S]… [--payload JSON]… [--file FILE]… [--save DIR] [--serve NAME=PATH]…
// [--stream] [--embedded | --socket P] [--app NAME] [--timeout S] [--config P]`: one request; prints which host served it, the outcome and
// the items (and with --stream each partial result as it arrives); --payload sends a value (an item's
// `attachments`, what a Codable extension decodes), --file sends a file as a descriptor (`fileAttachments`),
// --save writes what comes back. Exit status (main.swift's table): 0 completed,
// 3 cancelled, 4 interrupted, 2 usage or configuration error, 1 no daemon at an explicit --socket or no outcome.
// Without --socket or --embedded it uses the daemon when one answers on the configured socket, else an embedded
// host built from --config (or $SDKHOST_CONFIG), and says so on stderr.
import Dispatch
import SDKHost
import CSDKShim

#if canImport(Glibc)
import Glibc
#endif

enum RequestCommand {
    static let usage = """
        usage: sdk-host request <extension-id> [--text S]... [--payload JSON]... [--file FILE]... [--save DIR]
                                [--serve NAME=PATH]... [--stream] [--embedded | --socket PATH] [--app NAME]
                                [--timeout SECONDS] [--config PATH] [--log-level L]
          --text S        an input item with title S (repeatable; default: one empty item)
          --payload JSON  a value for the first item's payloads (`attachments`): what ExtensionItem(encoding:)
                          sends and a Codable extension reads with decode(_:) (repeatable; JSON without null;
                          @FILE reads the JSON from FILE, a regular file of at most 16 MiB)
          --file FILE     send FILE, opened read-only, as a file of the first item (`fileAttachments`, passed
                          as a descriptor: its bytes are never copied through the socket; repeatable, at most 64)
          --save DIR      write what the request returns into DIR (made if missing): each payload that is data
                          as itemN-attachmentK.bin and each file as itemN-fileK; never overwrites
          --serve NAME=PATH  answer the extension's calls to host service NAME (its manifest's HostServices):
                          with PATH's text for every call, or, when PATH is a folder, with the text of the file
                          in it that the call's first item's title names (a plain file name; no other path,
                          and not a link); a regular file of at most 16 MiB less 64 KiB
          --stream        print each partial result as it arrives, with the time since the request began
          --embedded      run the worker in this process's own host, from --config's extension paths
          --socket PATH   use the daemon at PATH (an error if none answers)
          --app NAME      the app name the daemon pools workers by (default: sdk-host)
          --timeout S     the request's deadline in seconds (default \(Int(defaultTimeout))), or the extension's
                          RequestDeadlineSeconds if sooner: past it the request is interrupted (timed out,
                          exit 4) and its worker told to cancel; this command gives up 10 s later
          --config PATH   the configuration: the daemon's socket, or the embedded host's extensions and limits
          --log-level L   an embedded host's log on stderr from level L: debug, info (its workers' own output:
                          print, sdkhost_log), warning (the default), error. Without it, a manifest the host
                          skipped is named only when <extension-id> is not found (sdk-host doctor lists them)
        Prints "served by: …" (the embedded host or the daemon, with the worker's pid), the outcome and the items.
        Ctrl-C cancels the request (its outcome is printed: cancelled, exit 3); a second Ctrl-C quits at once (130).
        Exit status 0 completed, 3 cancelled, 4 interrupted, 2 usage or configuration error, 1 no daemon at
        --socket, or no outcome in time.
        """
    static let defaultTimeout = 60.0

    static func run(_ arguments: [String]) -> Never {
        let options = Options(arguments, valued: ["--text", "--timeout", "--socket", "--config", "--app", "--file", "--attach",
                                                  "--payload", "--save", "--serve", "--log-level"],
                              boolean: ["--embedded", "--stream"], usage: usage)
        guard options.positionals.count == 1 else {
            fail(options.positionals.isEmpty ? "missing extension identifier" : "unexpected argument '\(options.positionals[1])'", status: ExitStatus.usage, usage: usage)
        }
        EmbeddedHost.configure(from: options)
        let identifier = options.positionals[0]
        var logLevel = LogLevel.warning
        if let raw = options.value("--log-level") {
            guard let level = LogLevel(name: raw) else { fail("--log-level: '\(raw)' is not one of debug, info, warning, error", status: ExitStatus.usage) }
            logLevel = level
        }
        var timeout = defaultTimeout
        if let raw = options.value("--timeout") {
            guard let t = Double(raw), t > 0, t <= 86_400 else { fail("--timeout: '\(raw)' is not a number of seconds in (0, 86400]", status: ExitStatus.usage) }
            timeout = t
        }
        if options.has("--embedded") && options.value("--socket") != nil {
            fail("--embedded and --socket exclude each other", status: ExitStatus.usage, usage: usage)
        }
        // An embedded host's log of a manifest it skipped is about another extension, unless it is this one's: held,
        // and said only if this extension is not found (or with --log-level, which asks for the whole log).
        let heldSkips = Mutex<[String]>([])
        let quietSkips = options.value("--log-level") == nil
        func embedded() -> ExtensionHost {
            EmbeddedHost.make(logLevel: logLevel) { configuration in
                guard quietSkips else { return }
                configuration.logHandler = { level, line in
                    if line.hasSuffix(HostEngine.skippedManifestSuffix) {
                        heldSkips.withLock { $0.append(line) }
                    } else {
                        HostConfiguration.standardErrorLog(level, line)
                    }
                }
            }
        }
        let host: ExtensionHost
        if options.has("--embedded") {
            host = embedded()
        } else {
            let socket = loadConfiguration(options).socketPath
            let explicit = options.value("--socket") != nil
            // --app names this request's app to the daemon: apps get their own workers (WorkerSharing perApp).
            let app = options.value("--app")
            let connected: Result<ExtensionHost, HostError> = runAsync {
                do throws(HostError) {
                    return .success(try await ExtensionHost.connect(socketPath: socket, appName: app, logHandler: HostConfiguration.standardErrorLog))
                } catch {
                    return .failure(error)
                }
            }
            switch connected {
            case .success(let h): host = h
            case .failure(let error) where explicit: fail("\(error)", status: ExitStatus.failure)
            case .failure(let error):
                // No daemon: embedded, as documented, and said so, with why (stdout stays the outcome's).
                host = embedded()
                var line = "sdk-host: \(daemonUnreachable(socket, error)); using an embedded host\n"
                line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
            }
        }
        let ext: Extension
        do {
            ext = try host.extension(identifier: identifier)
        } catch {
            // A manifest that did not read may have been this extension's.
            for line in heldSkips.withLock({ $0 }) { HostConfiguration.standardErrorLog(.error, line) }
            fail("\(error)", status: ExitStatus.usage)
        }
        for spec in options.values["--serve"] ?? [] { serve(spec, on: ext) }
        let texts = options.values["--text"] ?? []
        var items = texts.isEmpty ? [ExtensionItem()] : texts.map { ExtensionItem(title: $0) }
        for raw in options.values["--payload"] ?? [] {
            // @FILE: the JSON is FILE's (a value past the kernel's 128 KiB limit on one argument).
            var json = raw
            if raw.hasPrefix("@") {
                do {
                    let bytes = try readRegularFile(String(raw.dropFirst()), maxBytes: 16 << 20)
                    guard let text = String(validating: bytes, as: UTF8.self) else {
                        fail("--payload \(raw): not UTF-8 text", status: ExitStatus.usage)
                    }
                    json = text
                } catch {
                    fail("--payload \(raw): \(error)", status: ExitStatus.usage)
                }
            }
            do {
                items[0].attachments.append(try JSONInput.parse(json))
            } catch {
                fail("--payload: \(error) of '\(json.prefix(80))'", status: ExitStatus.usage)
            }
        }
        // --attach is --file's old name.
        let filePaths = (options.values["--file"] ?? []) + (options.values["--attach"] ?? [])
        if filePaths.count > 64 { fail("--file: \(filePaths.count) files; at most 64 per request", status: ExitStatus.usage) }
        for path in filePaths {
            do {
                items[0].fileAttachments.append(try FileAttachment(contentsOf: path))
            } catch {
                fail("--file: \(error)", status: ExitStatus.usage)
            }
        }
        let saveDirectory = options.value("--save")
        if let saveDirectory { prepareSaveDirectory(saveDirectory) }
        let waiter = OutcomeWaiter(attachingTo: ext)
        let began = monotonicNanoseconds()
        let beganAt = Double(time(nil)) - 1  // wall clock, for a crash report's time
        if options.has("--stream") {
            // Straight to fd 1, a line at a time: through a pipe, stdio would hold the lines until the end.
            ext.requestProgressHandler = { _, batch in
                let elapsed = Double(monotonicNanoseconds() - began) / 1e9
                for item in batch {
                    var line = "partial +\(formatSeconds(elapsed))s: \(describe(item))\n"
                    line.withUTF8 { _ = write(1, $0.baseAddress, $0.count) }
                }
            }
        }
        // Ctrl-C cancels the request, whose outcome is printed as any other (cancelled, exit 3); a second one, or
        // one after the outcome, ends the command at once (130). Before, the first ended it with no outcome, and
        // the daemon logged the client as dropped. A command started with SIGINT ignored (in the background, under
        // nohup) keeps ignoring it.
        let interrupted = Mutex<(id: RequestID?, count: Int, done: Bool)>((nil, 0, false))
        let cancelOnInterrupt: @Sendable (RequestID) -> Void = { id in
            var line = "sdk-host: Ctrl-C: cancelling \(id) (again to quit at once)\n"
            line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
            ext.cancelRequest(id)
        }
        var interrupts: (any DispatchSourceSignal)?
        if sdk_signal_is_ignored(SIGINT) == 0 {
            signal(SIGINT, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: SIGINT, queue: .global())
            source.setEventHandler {
                // `data`: the signals since the last call (two quick presses may come as one call).
                let presses = Int(source.data)
                let (id, count, done) = interrupted.withLock { $0.count += max(presses, 1); return ($0.id, $0.count, $0.done) }
                if count > 1 || done { _exit(130) }
                if let id { cancelOnInterrupt(id) }
            }
            source.resume()
            interrupts = source
        }
        let workerPid = Mutex<pid_t?>(nil)
        let id = ext.beginRequest(withInputItems: items, deadline: timeout, onWorkerAssigned: { pid in workerPid.withLock { $0 = pid } })
        items = []  // the attachments' descriptors are the request's now
        // A Ctrl-C that came before the request had its id cancels it now.
        if interrupted.withLock({ $0.id = id; return $0.count }) > 0 { cancelOnInterrupt(id) }
        // The deadline ends the request at the host; the extra 10 s covers a daemon that never answers at all.
        let outcome = waiter.wait(for: id, timeout: timeout + 10)
        interrupted.withLock { $0.done = true }  // a Ctrl-C now quits (the host's shutdown can take a while)
        _ = interrupts
        let mode = host.mode
        // An embedded host's worker that crashed: the end of its stderr says why (the daemon keeps its reports,
        // `sdk-host crashes`).
        var crash: CrashReport?
        switch (mode, outcome) {
        case (.embedded, .interrupted(.signal)?), (.embedded, .interrupted(.exited)?):
            crash = runAsync { await host.crashReportsInMemory() }.last { $0.inFlightRequests.contains(id) }
        case (.daemon, .interrupted(.signal)?), (.daemon, .interrupted(.exited)?):
            // The daemon's crash report of that worker: its ids are the daemon's own, so it is the one of the pid we
            // were told, written since this request began, with this outcome's reason (a pid can be reused).
            if let pid = workerPid.withLock({ $0 }), case .interrupted(let reason)? = outcome {
                crash = runAsync { await host.status() }?.recentCrashes.last { $0.pid == pid && $0.time >= beganAt && $0.reason == reason }
            }
        default: break
        }
        let stderrTail = crash.map { Array($0.stderrTail.split(separator: "\n").suffix(8)) } ?? []
        let finished = DispatchSemaphore(value: 0)
        host.shutdown { finished.signal() }
        finished.wait()
        let worker = workerPid.withLock { $0 }.map { "worker pid \($0)" } ?? "no worker"
        switch mode {
        case .embedded:
            print("served by: embedded host (\(EmbeddedHost.baseConfiguration().source)), \(worker)")
        case .daemon(let path, let pid):
            print("served by: daemon pid \(pid) at \(path), \(worker)")
        }
        guard let outcome else { fail("request \(id): no outcome within \(Int(timeout + 10)) s", status: ExitStatus.failure) }
        switch outcome {
        case .completed(let items):
            print("completed \(id)")
            for (n, item) in items.enumerated() { print("  item \(n): \(describe(item))") }
            if let saveDirectory { save(items, to: saveDirectory) }
            exit(ExitStatus.success)
        case .cancelled(let error):
            // One line: the extension wrote the error's text, newlines and all.
            print("cancelled \(id): " + "\(error)".displaySafe())
            exit(ExitStatus.cancelled)
        case .interrupted(let reason):
            print("interrupted \(id): " + "\(reason)".displaySafe())
            // Why it died (the Swift runtime's "Fatal error: …"), when the last lines are a backtrace's frames.
            if let why = crash?.fatalErrorLine, !stderrTail.contains(where: { $0.contains(why) }) {
                print("  why: " + String(why.prefix(200)).displaySafe())
            }
            if !stderrTail.isEmpty {
                print("  the worker's stderr, last \(stderrTail.count) line(s):")
                for line in stderrTail { print("  | " + String(line).displaySafe()) }
            }
            exit(ExitStatus.interrupted)
        }
    }
}

import Synchronization
import SDKPosix

extension RequestCommand {
    /// An item as one line of the outcome's report.
    static func describe(_ item: ExtensionItem) -> String {
        // One line per item, whatever the worker put in it: its strings are escaped newlines and all.
        ("title=\(item.title.map { "\"\($0)\"" } ?? "nil")"
            + (item.text.map { " text=\"\($0)\"" } ?? "")
            + " attachments=\(PlistValue.array(item.attachments)) userInfo=\(PlistValue.dictionary(item.userInfo))").displaySafe()
            + (item.fileAttachments.isEmpty ? "" : " files=[\(item.fileAttachments.map { "\($0.size) bytes" }.joined(separator: ", "))]")
    }

    /// `--serve NAME=PATH`: registers service NAME on `ext`, answered from PATH (checked now: a bad one is a usage
    /// error before the request runs).
    static func serve(_ spec: String, on ext: Extension) {
        guard let equals = spec.firstIndex(of: "="), equals != spec.startIndex, spec.index(after: equals) != spec.endIndex else {
            fail("--serve: '\(spec)' is not NAME=PATH", status: ExitStatus.usage)
        }
        let name = String(spec[..<equals]), path = String(spec[spec.index(after: equals)...])
        var st = stat()
        guard stat(path, &st) == 0 else {
            fail("--serve \(name): \(path): \(String(cString: strerror(errno)))", status: ExitStatus.usage)
        }
        let folder = st.st_mode & S_IFMT == S_IFDIR
        guard folder || st.st_mode & S_IFMT == S_IFREG else {
            fail("--serve \(name): \(path) is neither a regular file nor a folder", status: ExitStatus.usage)
        }
        do {
            try ext.registerService(name) { call in
                var file = path
                if folder {
                    let part = call.items.first?.title ?? ""
                    guard !part.isEmpty, !part.contains("/"), part != ".", part != "..", !part.utf8.contains(0) else {
                        throw ExtensionError(domain: "sdk-host.serve", code: 1, message: "'\(part)' is not a file name in \(path)")
                    }
                    file = "\(path)/\(part)"
                }
                do {
                    // A regular file that fits a reply's 16 MiB frame, read without waiting (a FIFO's
                    // open would) and, in a folder, not through a link: the extension names it, and a link would
                    // take the name out of the folder.
                    let bytes = try readRegularFile(file, maxBytes: (16 << 20) - (64 << 10), followingLinks: !folder)
                    return [ExtensionItem(title: call.items.first?.title, text: String(decoding: bytes, as: UTF8.self))]
                } catch {
                    throw ExtensionError(domain: "sdk-host.serve", code: 2, message: "cannot read \(file): \(error)")
                }
            }
        } catch {
            fail("--serve: \(error)", status: ExitStatus.usage)
        }
    }

    static func formatSeconds(_ seconds: Double) -> String {
        let ms = Int((seconds * 1000).rounded())
        let fraction = String(ms % 1000)
        return "\(ms / 1000)." + String(repeating: "0", count: 3 - fraction.count) + fraction
    }

    /// Makes DIR if it is missing (not its parents), before the request runs: a bad --save fails first.
    static func prepareSaveDirectory(_ path: String) {
        var st = stat()
        if stat(path, &st) == 0 {
            guard st.st_mode & S_IFMT == S_IFDIR else { fail("--save: \(path) exists and is not a folder", status: ExitStatus.usage) }
            return
        }
        guard mkdir(path, 0o755) == 0 else {
            fail("--save: cannot make \(path): \(String(cString: strerror(errno)))", status: ExitStatus.usage)
        }
    }

    /// Writes each data attachment and each descriptor attachment of `items` into `directory`, refusing to
    /// overwrite; prints what it wrote. A failure is exit status 1, after the outcome was printed.
    static func save(_ items: [ExtensionItem], to directory: String) {
        var failed = false
        for (n, item) in items.enumerated() {
            for (k, attachment) in item.attachments.enumerated() {
                guard case .data(let bytes) = attachment else { continue }
                let path = "\(trimmed(directory))/item\(n)-attachment\(k).bin"
                do {
                    try writeFile(path, bytes, mode: 0o644, exclusive: true)
                    print("saved \(path) (\(bytes.count) bytes)")
                } catch {
                    printError("--save: \(error)")
                    failed = true
                }
            }
            for (k, file) in item.fileAttachments.enumerated() {
                let path = "\(trimmed(directory))/item\(n)-file\(k)"
                do {
                    try file.save(to: path)
                    print("saved \(path) (\(file.size) bytes)")
                } catch {
                    printError("--save: \(error)")
                    failed = true
                }
            }
        }
        if failed { exit(ExitStatus.failure) }
    }

    /// `directory` without trailing slashes ("/" stays).
    static func trimmed(_ directory: String) -> String {
        var d = Substring(directory)
        while d.count > 1, d.hasSuffix("/") { d = d.dropLast() }
        return String(d)
    }

    static func printError(_ text: String) {
        var line = "sdk-host: \(text.displaySafe())\n"
        line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
    }
}
