// The flat messages (`Message.flatFields`: every value a string or an integer, such as `ping`, `pong`, `hello`,
// `welcome`, `assigned`, `cancel`, `credit`, `error`, or one level of tables and lists of those, as in
// `cancelled`, `interrupted` and `connected`) written as frames straight from their fields and read back
// without a `PlistValue` tree. Building that tree (a Swift Dictionary, so hashing and allocations) and walking it
// to encode, then decoding into another and looking each field up, cost more than everything else the host does
// with a heartbeat or a handshake. The bytes are a plain bplist00 any reader takes: the dictionary, its keys in
// order, then its values, no shared objects.

#if canImport(Glibc)
import Glibc
#endif

/// A value in a flat message.
package enum FlatValue: Sendable {
    /// A message type's name.
    case type(MessageType)
    /// A request id, as its 36-character upper-case string.
    case id(RequestID)
    case string(String)
    case integer(Int64)
    /// A dictionary of strings and integers, its keys in order (an interruption's reason, a cancellation's
    /// error, a daemon's extension points): one level, no deeper.
    case table([(key: String, value: FlatScalar)])
    /// A list of strings.
    case strings([String])

    /// The value as a decoder reads it back.
    var plist: PlistValue {
        switch self {
        case .type(let type): type.plist
        case .id(let id): .string(id.uuidString)
        case .string(let s): .string(s)
        case .integer(let i): .integer(i)
        case .table(let entries):
            .dictionary(Dictionary(entries.map { ($0.key, $0.value.plist) }, uniquingKeysWith: { _, last in last }))
        case .strings(let list): .array(list.map(PlistValue.string))
        }
    }
}

/// A value in a flat message's table.
package enum FlatScalar: Sendable {
    case string(String)
    case integer(Int64)

    var plist: PlistValue {
        switch self {
        case .string(let s): .string(s)
        case .integer(let i): .integer(i)
        }
    }

    /// `value` as a table, keys sorted, if it is a dictionary of strings and integers; nil for anything else.
    static func table(_ value: PlistValue) -> [(key: String, value: FlatScalar)]? {
        guard case .dictionary(let d) = value else { return nil }
        var entries: [(key: String, value: FlatScalar)] = []
        entries.reserveCapacity(d.count)
        for (key, value) in d {
            switch value {
            case .string(let s): entries.append((key, .string(s)))
            case .integer(let i): entries.append((key, .integer(i)))
            default: return nil
            }
        }
        entries.sort { $0.key < $1.key }
        return entries
    }
}

/// A field of a flat message. A struct, not a tuple: an array of tuples is destroyed element by element through
/// the runtime's generic tuple witness (~1.5% of a simulated schedule, most of it these arrays).
package struct FlatField {
    package let key: MessageKey
    package let value: FlatValue
    package init(_ key: MessageKey, _ value: FlatValue) {
        self.key = key
        self.value = value
    }
    package static func field(_ key: MessageKey, _ value: FlatValue) -> FlatField { FlatField(key, value) }
}

/// A flat message's fields in the order they are written.
package typealias FlatFields = [FlatField]

package enum FlatFrame {
    /// Appends the payload (no frame header) of a flat message: the dictionary, its keys in order, then its
    /// values. Over `limit` bytes nothing is appended and the size it would take is returned.
    package static func appendPayload(_ fields: FlatFields, to out: inout [UInt8], limit: Int = .max) -> Int? {
        BinaryPlistEncoder.encodeFields(appendingTo: &out, limit: limit, { emit(fields, into: &$0) }, { emit(fields, into: &$0) })
    }

    /// Objects: 0 the dictionary, 1...n the keys, n+1...2n the values, written in that order; a table's or a
    /// list's own objects follow it, numbered from 2n+1 on.
    private static func emit<Sink: FieldSink>(_ fields: FlatFields, into sink: inout Sink) -> Int {
        let n = fields.count
        var next = 1
        let first = sink.container(0xD0, count: n, references: 2 * n, at: 0, next: &next)
        for (i, field) in fields.enumerated() { sink.ascii(field.key.staticName, at: first + i) }
        for (i, field) in fields.enumerated() {
            let at = first + n + i
            switch field.value {
            case .type(let type): sink.ascii(type.staticName, at: at)
            case .id(let id): sink.uuid(id, at: at)
            case .string(let s): sink.string(s, at: at)
            case .integer(let v): sink.value(.integer(v), at: at, next: &next)
            case .table(let entries):
                let m = entries.count
                let start = sink.container(0xD0, count: m, references: 2 * m, at: at, next: &next)
                for (j, entry) in entries.enumerated() { sink.string(entry.key, at: start + j) }
                for (j, entry) in entries.enumerated() {
                    switch entry.value {
                    case .string(let s): sink.string(s, at: start + m + j)
                    case .integer(let v): sink.value(.integer(v), at: start + m + j, next: &next)
                    }
                }
            case .strings(let list):
                let start = sink.container(0xA0, count: list.count, references: list.count, at: at, next: &next)
                for (j, item) in list.enumerated() { sink.string(item, at: start + j) }
            }
        }
        return next
    }

    /// The message in `payload` if it is, byte for byte, what `appendPayload` writes for a flat message; nil for
    /// anything else (which is then decoded as usual). The fields are read from where that layout puts them (one-
    /// byte references and offsets, so payloads under 256 bytes; ASCII strings, integers, and one level of tables
    /// and lists of those) and the message is made
    /// from them; then it is written again and compared whole. So a payload is taken only if it is exactly our
    /// own encoding of the message returned, which the decoder reads as that message (`FlatFrameTests`): no check
    /// of the decoder's is skipped for any other payload, and a field read wrongly here only declines the fast way.
    package static func message(from payload: UnsafeRawBufferPointer) -> Message? {
        let count = payload.count
        // Magic, the dictionary's marker, one key and one value, the offset table, the 32-byte trailer.
        guard count >= 8 + 1 + 2 + 4 + 3 + 32, count < 256 else { return nil }
        let marker = payload[8]
        guard marker & 0xF0 == 0xD0, marker & 0x0F != 0x0F else { return nil }
        let n = Int(marker & 0x0F)
        // The trailer's object count (its low byte: a payload this small has fewer than 256 objects).
        let objects = Int(payload[count - 17])
        let tableAt = count - 32 - objects
        // Trailer: one-byte offsets and references, the table where it is.
        guard n > 0, objects >= 2 * n + 1, tableAt > 9 + 2 * n, payload[count - 26] == 1, payload[count - 25] == 1,
            payload[count - 1] == UInt8(tableAt)
        else { return nil }
        // The type is written first: a message that is not flat (a `begin`, a `complete`) is declined before its
        // other fields are read.
        func object(_ index: Int) -> Int? { offset(payload, objects: objects, tableAt: tableAt, of: index) }
        guard let typeKey = object(1).flatMap({ asciiString(payload, objectAt: $0, end: tableAt) }),
            MessageKey(ascii: typeKey) == .type,
            let typeName = object(1 + n).flatMap({ asciiString(payload, objectAt: $0, end: tableAt) }),
            MessageType(ascii: typeName)?.isFlat == true
        else { return nil }
        let read: Message? = withUnsafeTemporaryAllocation(of: (MessageKey, Raw).self, capacity: n) { storage in
            var fields = Fields(payload: payload, objects: objects, tableAt: tableAt, storage: storage)
            for i in 0..<n {
                guard let key = fields.offset(of: 1 + i).flatMap({ asciiString(payload, objectAt: $0, end: tableAt) }).flatMap(MessageKey.init(ascii:)),
                    let at = fields.offset(of: 1 + n + i)
                else { return nil }
                switch payload[at] & 0xF0 {
                case 0xD0, 0xA0:
                    // A table or a list: read when the message is made (`Fields.table`, `Fields.strings`).
                    fields.add(key, .container(at))
                default:
                    guard let value = scalar(payload, at: at, end: tableAt) else { return nil }
                    fields.add(key, value)
                }
            }
            return fields.message()
        }
        guard let candidate = read, let flat = candidate.flatFields else { return nil }
        // Written again into a buffer on the stack and compared.
        return withUnsafeTemporaryAllocation(byteCount: 256, alignment: 8) { buffer in
            var size = EncodedSize()
            _ = emit(flat, into: &size)
            guard let written = BinaryPlistEncoder.write(size, into: buffer, { emit(flat, into: &$0) }), written == count,
                memcmp(buffer.baseAddress!, payload.baseAddress!, count) == 0
            else { return nil }
            return candidate
        }
    }

    /// A flat payload's fields as read: the bytes of an ASCII string, an integer, or where a table or a list of
    /// those starts (all trivially copied: no field costs a retain).
    private enum Raw {
        case ascii(UnsafeRawBufferPointer)
        case integer(Int64)
        case container(Int)
    }

    /// The integer or ASCII string object at `at`.
    @inline(__always)
    private static func scalar(_ payload: UnsafeRawBufferPointer, at: Int, end: Int) -> Raw? {
        if payload[at] & 0xF0 == 0x10 {
            let width = 1 << Int(payload[at] & 0x0F)
            guard width <= 8, at + 1 + width <= end else { return nil }
            // Written with 8 bytes when negative, so the bits are the value.
            return .integer(Int64(bitPattern: BinaryPlistReader.bigEndian(payload, at: at + 1, size: width)))
        }
        return asciiString(payload, objectAt: at, end: end).map(Raw.ascii)
    }

    /// The fields of one payload, found by a linear search (a handful: no hashing). A key given twice is
    /// refused by the comparison: the message written again has it once.
    private struct Fields {
        private let payload: UnsafeRawBufferPointer
        private let objects: Int, tableAt: Int
        /// On the stack (a payload has at most 14 fields): no allocation per message.
        private let entries: UnsafeMutableBufferPointer<(MessageKey, Raw)>
        private var count = 0

        init(payload: UnsafeRawBufferPointer, objects: Int, tableAt: Int, storage: UnsafeMutableBufferPointer<(MessageKey, Raw)>) {
            self.payload = payload
            self.objects = objects
            self.tableAt = tableAt
            entries = storage
        }

        mutating func add(_ key: MessageKey, _ value: Raw) {
            (entries.baseAddress! + count).initialize(to: (key, value))
            count += 1
        }

        subscript(key: MessageKey) -> Raw? {
            for i in 0..<count where entries[i].0 == key { return entries[i].1 }
            return nil
        }

        func offset(of index: Int) -> Int? { FlatFrame.offset(payload, objects: objects, tableAt: tableAt, of: index) }

        /// The container under `key` if its marker is `marker` (0xD0 a table, 0xA0 a list): where its one-byte
        /// references start, and how many entries it has.
        private func container(_ key: MessageKey, _ marker: UInt8) -> (references: Int, count: Int)? {
            guard case .container(let at)? = self[key], payload[at] & 0xF0 == marker else { return nil }
            let count = Int(payload[at] & 0x0F)
            guard count != 0x0F, at + 1 + (marker == 0xD0 ? 2 * count : count) <= tableAt else { return nil }
            return (at + 1, count)
        }

        func integer(_ key: MessageKey) -> Int64? {
            if case .integer(let v)? = self[key] { v } else { nil }
        }
        func string(_ key: MessageKey) -> String? {
            if case .ascii(let bytes)? = self[key] { String(decoding: bytes, as: UTF8.self) } else { nil }
        }
        func id(_ key: MessageKey = .id) -> RequestID? {
            if case .ascii(let bytes)? = self[key] { RequestID(uuidBytes: bytes) } else { nil }
        }
        /// A table's entries as Swift values, in order; nil if `key` is not a table of ASCII strings and integers.
        func table(_ key: MessageKey) -> [(key: String, value: FlatScalar)]? {
            guard let (references, m) = container(key, 0xD0) else { return nil }
            var out: [(key: String, value: FlatScalar)] = []
            out.reserveCapacity(m)
            for j in 0..<m {
                guard let keyAt = offset(of: Int(payload[references + j])),
                    let name = asciiString(payload, objectAt: keyAt, end: tableAt),
                    let valueAt = offset(of: Int(payload[references + m + j]))
                else { return nil }
                switch scalar(payload, at: valueAt, end: tableAt) {
                case .ascii(let bytes)?: out.append((String(decoding: name, as: UTF8.self), .string(String(decoding: bytes, as: UTF8.self))))
                case .integer(let v)?: out.append((String(decoding: name, as: UTF8.self), .integer(v)))
                default: return nil
                }
            }
            return out
        }

        /// A list's strings, in order; nil if `key` is not a list of ASCII strings.
        func strings(_ key: MessageKey) -> [String]? {
            guard let (references, m) = container(key, 0xA0) else { return nil }
            var out: [String] = []
            out.reserveCapacity(m)
            for j in 0..<m {
                guard let itemAt = offset(of: Int(payload[references + j])),
                    let item = asciiString(payload, objectAt: itemAt, end: tableAt)
                else { return nil }
                out.append(String(decoding: item, as: UTF8.self))
            }
            return out
        }

        /// The flat message these fields are, as `Message(plist:)` reads it; nil for any other.
        func message() -> Message? {
            guard case .ascii(let name)? = self[.type], let type = MessageType(ascii: name) else { return nil }
            switch type {
            case .hello:
                guard let version = integer(.version), let identifier = string(.identifier), let pid = integer(.hostPid),
                    let idle = integer(.idleTimeoutMs) else { return nil }
                return .hello(version: version, identifier: identifier, hostPid: Int32(truncatingIfNeeded: pid), idleTimeoutMs: idle)
            case .welcome:
                guard let version = integer(.version), let identifier = string(.identifier),
                    let pid = integer(.pid).flatMap(Int32.init(exactly:)) else { return nil }
                return .welcome(version: version, identifier: identifier, pid: pid)
            case .credit:
                guard let id = id(), let count = integer(.count) else { return nil }
                return .credit(id: id, count: count)
            case .cancel: return id().map { .cancel(id: $0) }
            case .ping: return integer(.seq).map { .ping(seq: $0) }
            case .pong: return integer(.seq).map { .pong(seq: $0) }
            case .status: return integer(.seq).map { .status(seq: $0) }
            case .error:
                guard let message = string(.message) else { return nil }
                if self[.id] == nil { return .error(message: message, id: nil) }
                return id().map { .error(message: message, id: $0) }
            case .connect:
                guard let version = integer(.version) else { return nil }
                if self[.app] == nil { return .connect(version: version, app: nil) }
                return string(.app).map { .connect(version: version, app: $0) }
            case .prewarm:
                guard let id = id(), let extensionID = string(.`extension`) else { return nil }
                return .prewarm(id: id, extensionID: extensionID)
            case .prewarmed:
                guard let id = id(), let pid = integer(.pid).flatMap(Int32.init(exactly:)) else { return nil }
                return .prewarmed(id: id, pid: pid)
            case .assigned:
                guard let id = id(), let pid = integer(.pid).flatMap(Int32.init(exactly:)) else { return nil }
                return .assigned(id: id, pid: pid)
            case .subscribe: return .subscribe
            case .launchFailed: return string(.reason).map { .launchFailed(reason: $0) }
            case .hostCallCancel:
                guard let id = id(), let call = integer(.call) else { return nil }
                return .hostCallCancel(id: id, call: call)
            case .cancelled:
                guard let id = id(), let error = table(.error), error.count == 3,
                    case .integer(let code) = error[0].value, case .string(let domain) = error[1].value,
                    case .string(let message) = error[2].value
                else { return nil }
                return .cancelled(id: id, error: ExtensionError(domain: domain, code: code, message: message))
            case .interrupted:
                guard let id = id(), let reason = table(.reason) else { return nil }
                return .interrupted(id: id, reason: FlatValue.table(reason).plist)
            case .connected:
                guard let version = integer(.version), let pid = integer(.pid), let extensions = strings(.extensions),
                    let points = table(.points)
                else { return nil }
                func texts(_ table: [(key: String, value: FlatScalar)]) -> [String: String]? {
                    var named: [String: String] = [:]
                    for (key, value) in table {
                        guard case .string(let text) = value else { return nil }
                        named[key] = text
                    }
                    return named
                }
                // `problems` is written only when there are some.
                guard let named = texts(points), let problems = table(.problems).map(texts) ?? [:] else { return nil }
                return .connected(version: version, pid: Int32(truncatingIfNeeded: pid), extensions: extensions,
                                  extensionPoints: named, problems: problems)
            case .begin, .complete, .partial, .event, .sandboxed, .statusReport, .leak, .hostCall, .hostCallResult,
                .hostCallError:
                return nil
            }
        }
    }

    /// Where object `index` starts, from the one-byte offset table at `tableAt`; nil past the table.
    @inline(__always)
    private static func offset(_ payload: UnsafeRawBufferPointer, objects: Int, tableAt: Int, of index: Int) -> Int? {
        guard index >= 0, index < objects else { return nil }
        let at = Int(payload[tableAt + index])
        return at < tableAt ? at : nil
    }

    /// The bytes of the ASCII string object at `at` (a one-byte length, or `0x5F` and a one-byte integer).
    @inline(__always)
    private static func asciiString(_ payload: UnsafeRawBufferPointer, objectAt at: Int, end: Int) -> UnsafeRawBufferPointer? {
        guard at < end, payload[at] & 0xF0 == 0x50 else { return nil }
        var start = at + 1
        var length = Int(payload[at] & 0x0F)
        if length == 0x0F {
            guard at + 2 < end, payload[at + 1] == 0x10 else { return nil }
            length = Int(payload[at + 2])
            start = at + 3
        }
        guard start + length <= end else { return nil }
        let bytes = UnsafeRawBufferPointer(rebasing: payload[start..<start + length])
        return firstNonASCII(bytes) == nil ? bytes : nil
    }
}

extension MessageKey {
    /// The key these ASCII bytes spell, if any: compared with the names of the same length, without a `String`.
    init?(ascii bytes: UnsafeRawBufferPointer) {
        switch bytes.count {
        case 2:
            if bytes.spells(MessageKey.id.staticName) { self = .id; return }
        case 3:
            if bytes.spells(MessageKey.fds.staticName) { self = .fds; return }
            if bytes.spells(MessageKey.pid.staticName) { self = .pid; return }
            if bytes.spells(MessageKey.seq.staticName) { self = .seq; return }
            if bytes.spells(MessageKey.app.staticName) { self = .app; return }
        case 4:
            if bytes.spells(MessageKey.type.staticName) { self = .type; return }
            if bytes.spells(MessageKey.call.staticName) { self = .call; return }
            if bytes.spells(MessageKey.code.staticName) { self = .code; return }
            if bytes.spells(MessageKey.text.staticName) { self = .text; return }
        case 5:
            if bytes.spells(MessageKey.items.staticName) { self = .items; return }
            if bytes.spells(MessageKey.count.staticName) { self = .count; return }
            if bytes.spells(MessageKey.error.staticName) { self = .error; return }
            if bytes.spells(MessageKey.event.staticName) { self = .event; return }
            if bytes.spells(MessageKey.alive.staticName) { self = .alive; return }
            if bytes.spells(MessageKey.title.staticName) { self = .title; return }
            if bytes.spells(MessageKey.files.staticName) { self = .files; return }
        case 6:
            if bytes.spells(MessageKey.points.staticName) { self = .points; return }
            if bytes.spells(MessageKey.reason.staticName) { self = .reason; return }
            if bytes.spells(MessageKey.layers.staticName) { self = .layers; return }
            if bytes.spells(MessageKey.report.staticName) { self = .report; return }
            if bytes.spells(MessageKey.domain.staticName) { self = .domain; return }
        case 7:
            if bytes.spells(MessageKey.version.staticName) { self = .version; return }
            if bytes.spells(MessageKey.hostPid.staticName) { self = .hostPid; return }
            if bytes.spells(MessageKey.message.staticName) { self = .message; return }
            if bytes.spells(MessageKey.skipped.staticName) { self = .skipped; return }
            if bytes.spells(MessageKey.timings.staticName) { self = .timings; return }
            if bytes.spells(MessageKey.afterMs.staticName) { self = .afterMs; return }
            if bytes.spells(MessageKey.service.staticName) { self = .service; return }
        case 8:
            if bytes.spells(MessageKey.userInfo.staticName) { self = .userInfo; return }
            if bytes.spells(MessageKey.problems.staticName) { self = .problems; return }
        case 9:
            if bytes.spells(MessageKey.`extension`.staticName) { self = .`extension`; return }
        case 10:
            if bytes.spells(MessageKey.deadlineMs.staticName) { self = .deadlineMs; return }
            if bytes.spells(MessageKey.identifier.staticName) { self = .identifier; return }
            if bytes.spells(MessageKey.extensions.staticName) { self = .extensions; return }
        case 11:
            if bytes.spells(MessageKey.attachments.staticName) { self = .attachments; return }
        case 13:
            if bytes.spells(MessageKey.idleTimeoutMs.staticName) { self = .idleTimeoutMs; return }
        default: break
        }
        return nil
    }
}

extension MessageType {
    /// Whether a message of this type can be flat (`Message.flatFields`, `Fields.message`).
    var isFlat: Bool {
        switch self {
        case .hello, .welcome, .credit, .cancel, .cancelled, .ping, .pong, .error, .connect, .connected, .assigned,
            .interrupted, .status, .launchFailed, .prewarm, .prewarmed, .subscribe, .hostCallCancel:
            true
        case .begin, .complete, .partial, .event, .sandboxed, .statusReport, .leak, .hostCall, .hostCallResult,
            .hostCallError:
            false
        }
    }

    /// The type these ASCII bytes spell, if any.
    init?(ascii bytes: UnsafeRawBufferPointer) {
        switch bytes.count {
        case 4:
            if bytes.spells(MessageType.ping.staticName) { self = .ping; return }
            if bytes.spells(MessageType.pong.staticName) { self = .pong; return }
            if bytes.spells(MessageType.leak.staticName) { self = .leak; return }
        case 5:
            if bytes.spells(MessageType.hello.staticName) { self = .hello; return }
            if bytes.spells(MessageType.begin.staticName) { self = .begin; return }
            if bytes.spells(MessageType.error.staticName) { self = .error; return }
            if bytes.spells(MessageType.event.staticName) { self = .event; return }
        case 6:
            if bytes.spells(MessageType.credit.staticName) { self = .credit; return }
            if bytes.spells(MessageType.cancel.staticName) { self = .cancel; return }
            if bytes.spells(MessageType.status.staticName) { self = .status; return }
        case 7:
            if bytes.spells(MessageType.welcome.staticName) { self = .welcome; return }
            if bytes.spells(MessageType.partial.staticName) { self = .partial; return }
            if bytes.spells(MessageType.connect.staticName) { self = .connect; return }
            if bytes.spells(MessageType.prewarm.staticName) { self = .prewarm; return }
        case 8:
            if bytes.spells(MessageType.complete.staticName) { self = .complete; return }
            if bytes.spells(MessageType.assigned.staticName) { self = .assigned; return }
            if bytes.spells(MessageType.hostCall.staticName) { self = .hostCall; return }
        case 9:
            if bytes.spells(MessageType.cancelled.staticName) { self = .cancelled; return }
            if bytes.spells(MessageType.connected.staticName) { self = .connected; return }
            if bytes.spells(MessageType.sandboxed.staticName) { self = .sandboxed; return }
            if bytes.spells(MessageType.prewarmed.staticName) { self = .prewarmed; return }
            if bytes.spells(MessageType.subscribe.staticName) { self = .subscribe; return }
        case 11:
            if bytes.spells(MessageType.interrupted.staticName) { self = .interrupted; return }
        case 12:
            if bytes.spells(MessageType.statusReport.staticName) { self = .statusReport; return }
            if bytes.spells(MessageType.launchFailed.staticName) { self = .launchFailed; return }
        case 13:
            if bytes.spells(MessageType.hostCallError.staticName) { self = .hostCallError; return }
        case 14:
            if bytes.spells(MessageType.hostCallResult.staticName) { self = .hostCallResult; return }
            if bytes.spells(MessageType.hostCallCancel.staticName) { self = .hostCallCancel; return }
        default: break
        }
        return nil
    }
}
