// The wire's names, each declared once: every message type (`MessageType`) and every key of a message, of its
// error and of its items (`MessageKey`), with the dictionary helpers that spell keys through them. Messages.swift
// has the messages themselves.

/// Every message type's name on the wire (the `type` key), declared here only: the encoder, the decoder, the
/// flat writer (FlatFrame), the items writer (ItemsMessageEncoding) and the daemon's forward scanner all spell a
/// type through this. (The C launcher writes `sandboxed` and `launchFailed` itself; a test checks they match.)
public enum MessageType: String, CaseIterable, Sendable {
    case hello, welcome, begin, complete, partial, credit, cancel, cancelled, ping, pong, error, connect, connected
    case assigned, interrupted, status, statusReport, sandboxed, launchFailed, prewarm, prewarmed, leak, subscribe
    case event, hostCall, hostCallResult, hostCallError, hostCallCancel

    /// The name as a property-list string.
    public var plist: PlistValue { .string(rawValue) }

    /// The name as static bytes, for the writers and scanners that work on bytes without a `String`. Each is the
    /// case's own name (`MessageTypeTests` checks every one against `rawValue`).
    package var staticName: StaticString {
        switch self {
        case .hello: "hello"
        case .welcome: "welcome"
        case .begin: "begin"
        case .complete: "complete"
        case .partial: "partial"
        case .credit: "credit"
        case .cancel: "cancel"
        case .cancelled: "cancelled"
        case .ping: "ping"
        case .pong: "pong"
        case .error: "error"
        case .connect: "connect"
        case .connected: "connected"
        case .assigned: "assigned"
        case .interrupted: "interrupted"
        case .status: "status"
        case .statusReport: "statusReport"
        case .sandboxed: "sandboxed"
        case .launchFailed: "launchFailed"
        case .prewarm: "prewarm"
        case .prewarmed: "prewarmed"
        case .leak: "leak"
        case .subscribe: "subscribe"
        case .event: "event"
        case .hostCall: "hostCall"
        case .hostCallResult: "hostCallResult"
        case .hostCallError: "hostCallError"
        case .hostCallCancel: "hostCallCancel"
        }
    }
}

/// Every key of a message, of its error and of its items on the wire, declared here only: the encoder and
/// decoder (Messages.swift), the flat writer (FlatFrame), the items writer (ItemsMessageEncoding), the daemon's
/// forward scanner and its id rewriter all spell a key through this. (The C launcher writes `layers`, `skipped`, `pid`,
/// `timings` and `reason` itself; a test checks they match.)
public enum MessageKey: String, CaseIterable, Sendable {
    // Messages.
    case type, id, items, fds, `extension`, deadlineMs, version, identifier, hostPid, idleTimeoutMs, pid, count
    case error, seq, message, app, extensions, points, event, reason, layers, skipped, timings, report, alive
    case afterMs, call, service, problems
    // An error's fields (`domain`, `code` and `message`).
    case domain, code
    // An item's fields.
    case title, text, attachments, userInfo, files

    /// The key as static bytes, for the writers and scanners that work on bytes without a `String`. Each is the
    /// case's own name (`MessageTypeTests` checks every one against `rawValue`).
    package var staticName: StaticString {
        switch self {
        case .type: "type"
        case .id: "id"
        case .items: "items"
        case .fds: "fds"
        case .`extension`: "extension"
        case .deadlineMs: "deadlineMs"
        case .version: "version"
        case .identifier: "identifier"
        case .hostPid: "hostPid"
        case .idleTimeoutMs: "idleTimeoutMs"
        case .pid: "pid"
        case .count: "count"
        case .error: "error"
        case .seq: "seq"
        case .message: "message"
        case .app: "app"
        case .extensions: "extensions"
        case .points: "points"
        case .event: "event"
        case .reason: "reason"
        case .layers: "layers"
        case .skipped: "skipped"
        case .timings: "timings"
        case .report: "report"
        case .alive: "alive"
        case .afterMs: "afterMs"
        case .call: "call"
        case .service: "service"
        case .problems: "problems"
        case .domain: "domain"
        case .code: "code"
        case .title: "title"
        case .text: "text"
        case .attachments: "attachments"
        case .userInfo: "userInfo"
        case .files: "files"
        }
    }
}

extension Dictionary where Key == String, Value == PlistValue {
    /// A message's (or an item's) fields, keyed by their wire names.
    package init(fields: KeyValuePairs<MessageKey, PlistValue>) {
        self.init(minimumCapacity: fields.count)
        for (key, value) in fields { self[key.rawValue] = value }
    }

    /// The field named `key`.
    package subscript(key: MessageKey) -> PlistValue? {
        get { self[key.rawValue] }
        set { self[key.rawValue] = newValue }
    }
}

extension PlistValue {
    /// A dictionary of a message's (or an item's) fields.
    package static func fields(_ fields: KeyValuePairs<MessageKey, PlistValue>) -> PlistValue {
        .dictionary([String: PlistValue](fields: fields))
    }
}
