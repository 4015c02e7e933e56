// The protocol spoken between host and worker (and later client and daemon): every frame's payload is a
// dictionary with a `type` key. This file is the reference for how each message is encoded.
//
//   host -> worker   hello     {type, version, identifier, hostPid, idleTimeoutMs}
//   worker -> host   welcome   {type, version, identifier, pid}
//   host -> worker   begin     {type, id, items: [item], fds?}
//   client -> daemon begin     {type, id, items, fds?, extension, deadlineMs?}   (the daemon adds nothing more)
//   worker -> host   partial   {type, id, items, fds?}   a partial result, before the request ends
//   host -> worker   credit    {type, id, count}         the app took `count` partial results of `id`
//   worker -> host   complete  {type, id, items: [item], fds?}
//   host -> worker   cancel    {type, id}
//   worker -> host   cancelled {type, id, error: {domain, code, message}}
//   either way       ping      {type, seq}   and   pong {type, seq}
//   either way       error     {type, message, id?}
//   launcher -> host sandboxed {type, layers: [string], skipped: [string], pid?: string, timings?: [string]}
//                              first, before the extension runs; timings ("step microseconds") when asked
//   launcher -> host launchFailed {type, reason}   the sandbox could not be applied; the launcher exits 125
//   worker -> host   leak      {type, id, alive: [string], afterMs}   the request ended afterMs ago and these
//                              still live: "context" (its ExtensionContext), "task" (an async handler's Task)
//
// Host services (version 2): a worker running request `id` asks the app for something, under a call number of
// its own choosing (positive, not in use by another of the request's calls):
//   worker -> host   hostCall       {type, id, call, service, items, fds?}
//   host -> worker   hostCallResult {type, id, call, items, fds?}    the app's handler returned these
//   host -> worker   hostCallError  {type, id, call, error: {domain, code, message}}
//                                   the service is not listed (HostServices) or not provided, the handler threw,
//                                   or the request ended on the host
//   worker -> host   hostCallCancel {type, id, call}   the extension gave up on the call; no answer follows
// Each call gets at most one answer, and none after a hostCallCancel; an answer for a call the worker no longer
// waits for is dropped. Every call of a request ends with it: the host cancels the app's handlers, the worker
// fails its waiting calls. A worker keeps at most SDKHOST_MAX_HOST_CALLS (the manifest's MaxHostCallsInFlight)
// calls of one request in flight; one more is a protocol violation. Between daemon and client the same four,
// daemon -> client for hostCall and hostCallCancel, client -> daemon for the answers.
//
// Between a client library and the daemon, additionally:
//   client -> daemon connect     {type, version, app?}         app: the client's name (default: its executable's)
//   daemon -> client connected   {type, version, pid, extensions: [string], points?: {id: extension point},
//                                 problems?: {id: "<HostError code> <detail>"}}
//                                sent again after a SIGHUP rescan, with the new list; `problems` (written only when
//                                some are) names the listed extensions no request can start, as an embedded host's
//                                `extension(identifier:)` would refuse them
//   daemon -> client assigned    {type, id, pid}              the request was sent to worker `pid`
//   daemon -> client interrupted {type, id, reason: {kind, code?, detail?}}
//                                kind: signal|exit|hang|protocol|disconnected|launch|shutdown
//   client -> daemon status      {type, seq}    and    daemon -> client statusReport {type, seq, report}
//   client -> daemon prewarm     {type, id, extension}         start a worker for this app now
//   daemon -> client prewarmed   {type, id, pid}               ... it is handshaken (or: interrupted {id, reason})
//   client -> daemon subscribe   {type}                        send worker lifecycle events from now on
//   daemon -> client event       {type, event: {kind, extension, pid, app?, reason?, detail?}}
//                                kind: spawned|ready|exited|recycled|quarantined
//
//   item  = {title?: string, text?: string, attachments: [value], userInfo: {string: value}, files?: [integer]}
//   id    = UUID string, 8-4-4-4-12 upper-case hex
//
// Streaming: a worker may have at most `streamWindow` (16) partial results of one request that the host has not
// credited back; it waits for `credit` before sending more, and the host treats one more as a protocol
// violation. The host credits a partial result once the app has taken it (its progress handler returned, or
// its stream handed it out), so a worker that streams faster than the app reads is slowed, never buffered
// without bound. Between client and daemon the same: the daemon forwards `partial` to the client and the
// client's `credit` to the worker, never more than the worker used.
//
// Descriptors: a message with `fds: n` (1...64) is sent with one sendmsg whose SCM_RIGHTS control message holds
// n descriptors, attached to the frame's first byte. The receiver queues descriptors as they arrive and gives
// each frame, once complete, the first n in the queue. An item's `files` are indices into its message's
// descriptors. Every descriptor must be a regular file (memfds are); a message with more than 64, with fewer
// queued than it says, or with any other kind is a protocol error, and every descriptor it brought is closed.
//
// A message with an unknown `type` decodes as `.unknown` so that later versions can add types; the receiver
// logs and ignores it. A payload that is not a dictionary, lacks `type`, or has a known type with missing or
// ill-typed fields is a protocol error.

/// The protocol version sent in `hello` and `welcome`, and in `connect` and `connected`. 2 added host services:
/// a peer of version 1 would not know their messages, so the handshake refuses it.
public let protocolVersion: Int64 = 2

/// How many partial results of one request a worker may send before the host credits any back.
public let streamWindow = 16

/// The most descriptors one message may carry.
public let maxDescriptorsPerMessage = 64

/// An error an extension reports when it cancels a request, or the host's own reason for a cancellation.
public struct ExtensionError: Error, Hashable, Sendable, CustomStringConvertible {
    /// Who defined the code, e.g. "com.example.crasher" or "SDKHost".
    public var domain: String
    /// A code within the domain.
    public var code: Int64
    /// A human-readable explanation.
    public var message: String

    /// Creates an error.
    public init(domain: String, code: Int64, message: String) {
        self.domain = domain
        self.code = code
        self.message = message
    }

    /// The error the host reports when it cancelled a request itself (API call or Task cancellation).
    public static let cancelledByHost = ExtensionError(domain: "SDKHost", code: 1, message: "cancelled by the host")

    public var description: String { "\(domain) \(code): \(message)" }

    var plist: PlistValue { .fields([.domain: .string(domain), .code: .integer(code), .message: .string(message)]) }

    init(plist: PlistValue) throws(MessageError) {
        guard case .dictionary(let d) = plist, let domain = d[.domain]?.stringValue,
            let code = d[.code]?.integerValue, let message = d[.message]?.stringValue
        else { throw MessageError("error must be {domain: string, code: integer, message: string}") }
        self.init(domain: domain, code: code, message: message)
    }
}

/// A payload that decoded as a property list but is not a valid message.
public struct MessageError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What is wrong with it.
    public let detail: String
    /// Creates an error.
    public init(_ detail: String) { self.detail = detail }
    public var description: String { detail }
}

/// A protocol message. See the file header for the encoding of each.
public enum Message: Sendable, Equatable {
    // Each case is one message `type`; the file header gives every field's encoding.
    case hello(version: Int64, identifier: String, hostPid: Int32, idleTimeoutMs: Int64)
    case welcome(version: Int64, identifier: String, pid: Int32)
    case begin(id: RequestID, items: [ExtensionItem], extensionID: String? = nil, deadlineMs: Int64? = nil)
    case complete(id: RequestID, items: [ExtensionItem])
    case partial(id: RequestID, items: [ExtensionItem])
    case credit(id: RequestID, count: Int64)
    case cancel(id: RequestID)
    case cancelled(id: RequestID, error: ExtensionError)
    case ping(seq: Int64)
    case pong(seq: Int64)
    case error(message: String, id: RequestID?)
    case connect(version: Int64, app: String? = nil)
    case connected(version: Int64, pid: Int32, extensions: [String], extensionPoints: [String: String] = [:],
                   problems: [String: String] = [:])
    case assigned(id: RequestID, pid: Int32)
    case interrupted(id: RequestID, reason: PlistValue)
    case status(seq: Int64)
    case statusReport(seq: Int64, report: PlistValue)
    /// `pid`: the worker's pid as the host sees it, when the launcher runs it in its own pid namespace.
    case sandboxed(layers: [String], skipped: [String], pid: Int32? = nil, timings: [String] = [])
    case launchFailed(reason: String)
    case prewarm(id: RequestID, extensionID: String)
    case prewarmed(id: RequestID, pid: Int32)
    case leak(id: RequestID, alive: [String], afterMs: Int64)
    case subscribe
    case event(PlistValue)
    case hostCall(id: RequestID, call: Int64, service: String, items: [ExtensionItem])
    case hostCallResult(id: RequestID, call: Int64, items: [ExtensionItem])
    case hostCallError(id: RequestID, call: Int64, error: ExtensionError)
    case hostCallCancel(id: RequestID, call: Int64)
    /// A type this version does not know; ignored by receivers.
    case unknown(type: String)

    /// The wire form.
    public var plist: PlistValue {
        if let flat = flatFields {
            var d = [String: PlistValue](minimumCapacity: flat.count)
            for field in flat { d[field.key.rawValue] = field.value.plist }
            return .dictionary(d)
        }
        switch self {
        case let .begin(id, items, extensionID, deadlineMs):
            var d = Self.itemsMessage(.begin, id, items)
            if let extensionID { d[.`extension`] = .string(extensionID) }
            if let deadlineMs { d[.deadlineMs] = .integer(deadlineMs) }
            return .dictionary(d)
        case let .complete(id, items):
            return .dictionary(Self.itemsMessage(.complete, id, items))
        case let .partial(id, items):
            return .dictionary(Self.itemsMessage(.partial, id, items))
        case let .event(event):
            return .fields([.type: MessageType.event.plist, .event: event])
        case let .interrupted(id, reason):
            // A reason that is not a table of strings and integers (`flatFields`).
            return .fields([.type: MessageType.interrupted.plist, .id: .string(id.uuidString), .reason: reason])
        case let .sandboxed(layers, skipped, pid, timings):
            var fields = [String: PlistValue](fields: [.type: MessageType.sandboxed.plist, .layers: .array(layers.map(PlistValue.string)),
                                                .skipped: .array(skipped.map(PlistValue.string))])
            if let pid { fields[.pid] = .string(String(pid)) }
            if !timings.isEmpty { fields[.timings] = .array(timings.map(PlistValue.string)) }
            return .dictionary(fields)
        case let .statusReport(seq, report):
            return .fields([.type: MessageType.statusReport.plist, .seq: .integer(seq), .report: report])
        case let .leak(id, alive, afterMs):
            return .fields([.type: MessageType.leak.plist, .id: .string(id.uuidString), .alive: .array(alive.map(PlistValue.string)),
                    .afterMs: .integer(afterMs)])
        case let .hostCall(id, call, service, items):
            var d = Self.itemsMessage(.hostCall, id, items)
            d[.call] = .integer(call)
            d[.service] = .string(service)
            return .dictionary(d)
        case let .hostCallResult(id, call, items):
            var d = Self.itemsMessage(.hostCallResult, id, items)
            d[.call] = .integer(call)
            return .dictionary(d)
        case let .hostCallError(id, call, error):
            return .fields([.type: MessageType.hostCallError.plist, .id: .string(id.uuidString), .call: .integer(call),
                            .error: error.plist])
        case .hello, .welcome, .credit, .cancel, .cancelled, .ping, .pong, .error, .connect, .connected, .prewarm,
            .prewarmed, .subscribe, .assigned, .launchFailed, .status, .hostCallCancel, .unknown:
            preconditionFailure("a flat message is written from its flatFields")
        }
    }

    /// The fields of a message whose values are all strings and integers, or one level of tables and lists of
    /// those (a cancellation's error, an interruption's reason, `connected`), in the order they are written; nil
    /// for the others (items, reports, events). Their `plist` is made from these, and `FlatFrame` writes and reads
    /// them without a `PlistValue` tree.
    package var flatFields: FlatFields? {
        switch self {
        case let .hello(version, identifier, hostPid, idle):
            [.field(.type, .type(.hello)), .field(.version, .integer(version)), .field(.identifier, .string(identifier)),
             .field(.hostPid, .integer(Int64(hostPid))), .field(.idleTimeoutMs, .integer(idle))]
        case let .welcome(version, identifier, pid):
            [.field(.type, .type(.welcome)), .field(.version, .integer(version)), .field(.identifier, .string(identifier)),
             .field(.pid, .integer(Int64(pid)))]
        case let .credit(id, count):
            [.field(.type, .type(.credit)), .field(.id, .id(id)), .field(.count, .integer(count))]
        case let .cancel(id): [.field(.type, .type(.cancel)), .field(.id, .id(id))]
        case let .ping(seq): [.field(.type, .type(.ping)), .field(.seq, .integer(seq))]
        case let .pong(seq): [.field(.type, .type(.pong)), .field(.seq, .integer(seq))]
        case let .error(message, id):
            if let id {
                [.field(.type, .type(.error)), .field(.message, .string(message)), .field(.id, .id(id))]
            } else {
                [.field(.type, .type(.error)), .field(.message, .string(message))]
            }
        case let .connect(version, app):
            if let app {
                [.field(.type, .type(.connect)), .field(.version, .integer(version)), .field(.app, .string(app))]
            } else {
                [.field(.type, .type(.connect)), .field(.version, .integer(version))]
            }
        case let .prewarm(id, extensionID):
            [.field(.type, .type(.prewarm)), .field(.id, .id(id)), .field(.`extension`, .string(extensionID))]
        case let .prewarmed(id, pid):
            [.field(.type, .type(.prewarmed)), .field(.id, .id(id)), .field(.pid, .integer(Int64(pid)))]
        case .subscribe: [.field(.type, .type(.subscribe))]
        case let .assigned(id, pid):
            [.field(.type, .type(.assigned)), .field(.id, .id(id)), .field(.pid, .integer(Int64(pid)))]
        case let .launchFailed(reason): [.field(.type, .type(.launchFailed)), .field(.reason, .string(reason))]
        case let .status(seq): [.field(.type, .type(.status)), .field(.seq, .integer(seq))]
        case let .hostCallCancel(id, call):
            [.field(.type, .type(.hostCallCancel)), .field(.id, .id(id)), .field(.call, .integer(call))]
        case let .unknown(type): [.field(.type, .string(type))]
        case let .cancelled(id, error):
            // The table's keys in order: code, domain, message.
            [.field(.type, .type(.cancelled)), .field(.id, .id(id)),
             .field(.error, .table([(MessageKey.code.rawValue, .integer(error.code)), (MessageKey.domain.rawValue, .string(error.domain)),
                                    (MessageKey.message.rawValue, .string(error.message))]))]
        case let .connected(version, pid, extensions, points, problems):
            [.field(.type, .type(.connected)), .field(.version, .integer(version)), .field(.pid, .integer(Int64(pid))),
             .field(.extensions, .strings(extensions)),
             .field(.points, .table(points.sorted { $0.key < $1.key }.map { ($0.key, .string($0.value)) }))]
                + (problems.isEmpty ? [] : [.field(.problems, .table(problems.sorted { $0.key < $1.key }.map { ($0.key, .string($0.value)) }))])
        case let .interrupted(id, reason):
            FlatScalar.table(reason).map { [.field(.type, .type(.interrupted)), .field(.id, .id(id)), .field(.reason, .table($0))] }
        case .begin, .complete, .partial, .event, .sandboxed, .statusReport, .leak, .hostCall, .hostCallResult,
            .hostCallError:
            nil
        }
    }

    /// `{type, id, items, fds?}` with the items' files numbered in order.
    private static func itemsMessage(_ type: MessageType, _ id: RequestID, _ items: [ExtensionItem]) -> [String: PlistValue] {
        var next = 0
        var d = [String: PlistValue](fields: [.type: type.plist, .id: .string(id.uuidString)])
        d[.items] = .array(items.map { $0.plist(numberingFilesFrom: &next) })
        if next > 0 { d[.fds] = .integer(Int64(next)) }
        return d
    }

    /// The descriptors this message carries, in the order its `files` indices number them.
    public var fileAttachments: [FileAttachment] {
        switch self {
        case .begin(_, let items, _, _), .complete(_, let items), .partial(_, let items), .hostCall(_, _, _, let items),
            .hostCallResult(_, _, let items):
            // Most messages carry none: no array is made for them.
            guard items.contains(where: { !$0.fileAttachments.isEmpty }) else { return [] }
            return items.flatMap { $0.fileAttachments }
        default:
            return []
        }
    }

    /// Whether a value in its items nests `levels` deep or more (a walk that stops there): only then can its frame
    /// be too deep for the receiver (`OutgoingDescriptors.encode` checks such a frame as the receiver will).
    package func itemsNest(_ levels: Int) -> Bool {
        func deep(_ value: PlistValue, _ left: Int) -> Bool {
            guard left > 0 else { return true }
            switch value {
            case .array(let elements): return elements.contains { deep($0, left - 1) }
            case .dictionary(let entries): return entries.values.contains { deep($0, left - 1) }
            default: return false
            }
        }
        switch self {
        case .begin(_, let items, _, _), .complete(_, let items), .partial(_, let items), .hostCall(_, _, _, let items),
            .hostCallResult(_, _, let items):
            return items.contains { item in
                item.attachments.contains { deep($0, levels) } || item.userInfo.values.contains { deep($0, levels) }
            }
        default:
            return false
        }
    }

    /// How many descriptors a decoded payload says its frame carries (its `fds`): 0 when absent.
    ///
    /// - Throws: `MessageError` for a value that is not an integer in 0...64.
    public static func descriptorCount(of plist: PlistValue) throws(MessageError) -> Int {
        guard case .dictionary(let d) = plist, let raw = d[.fds] else { return 0 }
        guard let n = raw.integerValue, n >= 0 else { throw MessageError("'fds' must be a non-negative integer") }
        guard n <= maxDescriptorsPerMessage else {
            throw MessageError("message carries \(n) descriptors; at most \(maxDescriptorsPerMessage) are allowed")
        }
        return Int(n)
    }

    /// Parses a decoded payload; `files` are the descriptors its frame brought (see `descriptorCount(of:)`).
    ///
    /// - Throws: `MessageError` naming the message type and the field that is missing or ill-typed.
    public init(plist: PlistValue, files: [FileAttachment] = []) throws(MessageError) {
        guard case .dictionary(let d) = plist else {
            throw MessageError("message is a \(plist.kindName), not a dictionary")
        }
        guard let type = d[.type]?.stringValue else { throw MessageError("message has no string 'type'") }
        let known = MessageType(rawValue: type)
        if !files.isEmpty, known != .begin, known != .complete, known != .partial, known != .hostCall,
            known != .hostCallResult
        {
            throw MessageError("'\(type)' cannot carry descriptors")
        }
        func string(_ key: MessageKey) throws(MessageError) -> String {
            guard let v = d[key]?.stringValue else { throw MessageError("'\(type)' needs a string '\(key.rawValue)'") }
            return v
        }
        func integer(_ key: MessageKey) throws(MessageError) -> Int64 {
            guard let v = d[key]?.integerValue else { throw MessageError("'\(type)' needs an integer '\(key.rawValue)'") }
            return v
        }
        func id() throws(MessageError) -> RequestID {
            let raw = try string(.id)
            guard let id = RequestID(wireString: raw) else {
                let shown = String(decoding: raw.utf8.prefix(40), as: UTF8.self).displaySafe()
                throw MessageError("'\(type)' id '\(shown)' is not a UUID in upper-case 8-4-4-4-12 form")
            }
            return id
        }
        func strings(_ key: MessageKey) throws(MessageError) -> [String] {
            guard case .array(let raw)? = d[key] else { throw MessageError("'\(type)' needs an array '\(key.rawValue)'") }
            var out: [String] = []
            for v in raw {
                guard let s = v.stringValue else { throw MessageError("'\(type)' \(key.rawValue) must be strings") }
                out.append(s)
            }
            return out
        }
        func items() throws(MessageError) -> [ExtensionItem] {
            guard case .array(let raw)? = d[.items] else { throw MessageError("'\(type)' needs an array 'items'") }
            var out: [ExtensionItem] = []
            out.reserveCapacity(raw.count)
            for item in raw { out.append(try ExtensionItem(plist: item, files: files)) }
            return out
        }
        switch known {
        case .hello?:
            let pid = try integer(.hostPid)
            self = .hello(version: try integer(.version), identifier: try string(.identifier),
                          hostPid: Int32(truncatingIfNeeded: pid), idleTimeoutMs: try integer(.idleTimeoutMs))
        case .welcome?:
            let pid = try integer(.pid)
            guard let pid32 = Int32(exactly: pid) else { throw MessageError("'welcome' pid \(pid) is out of range") }
            self = .welcome(version: try integer(.version), identifier: try string(.identifier), pid: pid32)
        case .begin?:
            let ext: String? = d[.`extension`] == nil ? nil : try string(.`extension`)
            let deadline: Int64? = d[.deadlineMs] == nil ? nil : try integer(.deadlineMs)
            self = .begin(id: try id(), items: try items(), extensionID: ext, deadlineMs: deadline)
        case .complete?: self = .complete(id: try id(), items: try items())
        case .partial?: self = .partial(id: try id(), items: try items())
        case .credit?: self = .credit(id: try id(), count: try integer(.count))
        case .cancel?: self = .cancel(id: try id())
        case .cancelled?:
            guard let e = d[.error] else { throw MessageError("'cancelled' needs an 'error'") }
            self = .cancelled(id: try id(), error: try ExtensionError(plist: e))
        case .ping?: self = .ping(seq: try integer(.seq))
        case .pong?: self = .pong(seq: try integer(.seq))
        case .error?:
            self = .error(message: try string(.message), id: d[.id] == nil ? nil : try id())
        case .connect?:
            self = .connect(version: try integer(.version), app: d[.app] == nil ? nil : try string(.app))
        case .prewarm?: self = .prewarm(id: try id(), extensionID: try string(.`extension`))
        case .prewarmed?:
            let pid = try integer(.pid)
            guard let pid32 = Int32(exactly: pid) else { throw MessageError("'prewarmed' pid \(pid) is out of range") }
            self = .prewarmed(id: try id(), pid: pid32)
        case .connected?:
            let pid = try integer(.pid)
            func stringTable(_ key: MessageKey) throws(MessageError) -> [String: String] {
                var table: [String: String] = [:]
                switch d[key] {
                case nil: break
                case .dictionary(let raw)?:
                    for (name, value) in raw {
                        guard let text = value.stringValue else { throw MessageError("'connected' \(key.rawValue) must be strings") }
                        table[name] = text
                    }
                case let other?: throw MessageError("'connected' \(key.rawValue) is a \(other.kindName), not a dictionary")
                }
                return table
            }
            self = .connected(version: try integer(.version), pid: Int32(truncatingIfNeeded: pid),
                              extensions: try strings(.extensions), extensionPoints: try stringTable(.points),
                              problems: try stringTable(.problems))
        case .sandboxed?:
            // The launcher writes the pid as a string (its frame writer has strings only).
            let pid = d[.pid]?.stringValue.flatMap { Int32($0) }
            self = .sandboxed(layers: try strings(.layers), skipped: try strings(.skipped), pid: pid,
                              timings: d[.timings] == nil ? [] : try strings(.timings))
        case .launchFailed?: self = .launchFailed(reason: try string(.reason))
        case .assigned?:
            let pid = try integer(.pid)
            guard let pid32 = Int32(exactly: pid) else { throw MessageError("'assigned' pid \(pid) is out of range") }
            self = .assigned(id: try id(), pid: pid32)
        case .interrupted?:
            guard let reason = d[.reason] else { throw MessageError("'interrupted' needs a 'reason'") }
            self = .interrupted(id: try id(), reason: reason)
        case .status?: self = .status(seq: try integer(.seq))
        case .statusReport?:
            guard let report = d[.report] else { throw MessageError("'statusReport' needs a 'report'") }
            self = .statusReport(seq: try integer(.seq), report: report)
        case .leak?: self = .leak(id: try id(), alive: try strings(.alive), afterMs: try integer(.afterMs))
        case .subscribe?: self = .subscribe
        case .event?:
            guard let event = d[.event], case .dictionary = event else { throw MessageError("'event' needs a dictionary 'event'") }
            self = .event(event)
        case .hostCall?:
            self = .hostCall(id: try id(), call: try integer(.call), service: try string(.service), items: try items())
        case .hostCallResult?: self = .hostCallResult(id: try id(), call: try integer(.call), items: try items())
        case .hostCallError?:
            guard let e = d[.error] else { throw MessageError("'hostCallError' needs an 'error'") }
            self = .hostCallError(id: try id(), call: try integer(.call), error: try ExtensionError(plist: e))
        case .hostCallCancel?: self = .hostCallCancel(id: try id(), call: try integer(.call))
        case nil: self = .unknown(type: type)
        }
    }
}

extension Message {
    /// The message's `type` on the wire ("begin", "complete", ...), for logs: never the payload, which may be
    /// large or hostile.
    public var typeName: String { type?.rawValue ?? "unknown" }

    /// The message's type; nil for one this version does not know.
    public var type: MessageType? {
        switch self {
        case .hello: .hello
        case .welcome: .welcome
        case .begin: .begin
        case .complete: .complete
        case .partial: .partial
        case .credit: .credit
        case .cancel: .cancel
        case .cancelled: .cancelled
        case .ping: .ping
        case .pong: .pong
        case .error: .error
        case .connect: .connect
        case .connected: .connected
        case .assigned: .assigned
        case .interrupted: .interrupted
        case .status: .status
        case .statusReport: .statusReport
        case .sandboxed: .sandboxed
        case .launchFailed: .launchFailed
        case .prewarm: .prewarm
        case .prewarmed: .prewarmed
        case .leak: .leak
        case .subscribe: .subscribe
        case .event: .event
        case .hostCall: .hostCall
        case .hostCallResult: .hostCallResult
        case .hostCallError: .hostCallError
        case .hostCallCancel: .hostCallCancel
        case .unknown: nil
        }
    }
}
