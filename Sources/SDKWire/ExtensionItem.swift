// The request's identity and its unit of input and output: RequestID (a UUID on the wire) and ExtensionItem
// (NSExtensionItem's shape, plus file attachments). Their wire forms are described in Messages.swift.

import CSDKShim
import Synchronization

/// 128 bits from the system's generator, through the shim's per-thread pool: one getrandom call per 16 draws (the
/// generator makes one per 64 bits). Request ids and the host's ping numbers draw from it.
package func randomWords() -> (UInt64, UInt64) {
    var words: (UInt64, UInt64) = (0, 0)
    if withUnsafeMutableBytes(of: &words, { sdk_random_16($0.baseAddress) }) == 0 { return words }
    var g = SystemRandomNumberGenerator()
    return (g.next(), g.next())
}

/// Identifies one request. Random 128 bits, written as a UUID string on the wire.
public struct RequestID: Hashable, Sendable, CustomStringConvertible {
    /// The high and low 64 bits.
    public let high: UInt64, low: UInt64

    /// A new random (version 4) identifier.
    public init() {
        // A request id is made on every beginRequest: from the pool, not a getrandom call each.
        let (high, low) = randomWords()
        self.init(high: high, low: low)
    }

    /// A new identifier distinct from every other this process made this way, without a system call: a random
    /// 128-bit key drawn once, with a counter in the low 62 bits. Predictable within the process, so only for ids
    /// that need to be distinct and are never shown to another party as a secret: the daemon's ids for the requests
    /// it forwards to its workers (a worker can complete only what was sent to it).
    package static func distinct() -> RequestID {
        let n = distinctCounter.add(1, ordering: .relaxed).newValue
        return RequestID(high: distinctKey.high, low: distinctKey.low ^ (n & (1 << 62 - 1)))
    }

    package init(high: UInt64, low: UInt64) {
        // Version 4, RFC 4122 variant.
        self.high = (high & ~0xF000) | 0x4000
        self.low = (low & ~(UInt64(0xC) << 60)) | (UInt64(0x8) << 60)
    }

    /// Parses the 36-character UUID form, in either case (as Foundation's `UUID(uuidString:)` does); nil for
    /// anything else. A message's id is read by the stricter `init?(wireString:)`.
    public init?(uuidString s: String) {
        var s = s
        guard let id = s.withUTF8({ RequestID(uuidBytes: UnsafeRawBufferPointer($0), anyCase: true) }) else { return nil }
        self = id
    }

    /// Parses an id as the protocol writes it: the UUID form in upper case (as `uuidString` writes it). A
    /// lower-case id is refused, not folded: the host answers under the id it parsed, written upper case, so a
    /// peer that sent another spelling would never see its answer under the id it knows.
    package init?(wireString s: String) {
        var s = s
        guard let id = s.withUTF8({ RequestID(uuidBytes: UnsafeRawBufferPointer($0)) }) else { return nil }
        self = id
    }

    /// Parses the 36 ASCII bytes of the UUID form: upper case only (the wire's form), or either case; nil for
    /// anything else.
    @inline(__always)
    package init?(uuidBytes u: UnsafeRawBufferPointer, anyCase: Bool = false) {
        // Every id of every message is parsed (the first version's per-character switch was 7% of a daemon
        // client's loop thread under load): each group of digits is read straight from its offset, without a
        // table (a global, so a lazy-initialisation check per call) or index checks. A byte that is not a hex
        // digit maps to 0x10, which the OR of all digits catches at the end.
        guard u.count == 36, u[8] == UInt8(ascii: "-"), u[13] == UInt8(ascii: "-"), u[18] == UInt8(ascii: "-"),
            u[23] == UInt8(ascii: "-")
        else { return nil }
        let base = u.baseAddress!
        var seen: UInt8 = 0
        @inline(__always) func digits(_ word: inout UInt64, _ count: Int, at offset: Int) {
            for k in 0..<count {
                let c = base.load(fromByteOffset: offset + k, as: UInt8.self)
                let decimal = c &- UInt8(ascii: "0"), letter = (anyCase ? c | 0x20 : c) &- UInt8(ascii: anyCase ? "a" : "A")
                let v: UInt8 = decimal < 10 ? decimal : letter < 6 ? letter &+ 10 : 0x10
                seen |= v
                word = word << 4 | UInt64(v & 0xF)
            }
        }
        var high: UInt64 = 0, low: UInt64 = 0
        digits(&high, 8, at: 0)
        digits(&high, 4, at: 9)
        digits(&high, 4, at: 14)
        digits(&low, 4, at: 19)
        digits(&low, 12, at: 24)
        guard seen & 0x10 == 0 else { return nil }
        self.high = high
        self.low = low
    }

    /// The UUID string, e.g. "6F9619FF-8B86-4011-B42D-00C04FC964FF".
    public var uuidString: String {
        String(unsafeUninitializedCapacity: 36) { buffer in
            writeUUID(into: UnsafeMutableRawBufferPointer(buffer))
            return 36
        }
    }

    /// Writes the 36 bytes of the UUID string into the start of `out`, which must hold at least 36.
    package func writeUUID(into out: UnsafeMutableRawBufferPointer) {
        // Straight-line and branch-free per digit: the ids of every message are written, some twice (the daemon
        // rewrites each forwarded one), and the first version's per-character loop with its index checks was 3%
        // of the daemon's loop thread.
        precondition(out.count >= 36)
        let base = out.baseAddress!
        @inline(__always) func digits(_ word: UInt64, _ count: Int, at offset: Int) {
            for k in 0..<count {
                let nibble = UInt8(truncatingIfNeeded: word >> UInt64(4 * (count - 1 - k))) & 0xF
                // '0' + nibble, plus 7 more ('A' - '9' - 1) when the nibble is over 9.
                let digit = nibble &+ 0x30 &+ ((9 &- nibble) >> 7) &* 7
                base.storeBytes(of: digit, toByteOffset: offset + k, as: UInt8.self)
            }
        }
        let dash = UInt8(ascii: "-")
        digits(high >> 32, 8, at: 0)
        base.storeBytes(of: dash, toByteOffset: 8, as: UInt8.self)
        digits(high >> 16, 4, at: 9)
        base.storeBytes(of: dash, toByteOffset: 13, as: UInt8.self)
        digits(high, 4, at: 14)
        base.storeBytes(of: dash, toByteOffset: 18, as: UInt8.self)
        digits(low >> 48, 4, at: 19)
        base.storeBytes(of: dash, toByteOffset: 23, as: UInt8.self)
        digits(low, 12, at: 24)
    }

    public var description: String { uuidString }
}

private let distinctKey = RequestID()
private let distinctCounter = Atomic<UInt64>(0)

/// One unit of input or output, modelled on NSExtensionItem.
public struct ExtensionItem: Equatable, Sendable, CustomStringConvertible {
    /// A short title.
    public var title: String?
    /// The item's text content (NSExtensionItem's `attributedContentText`, as plain text).
    public var text: String?
    /// The payloads.
    public var attachments: [PlistValue]
    /// Anything else the two sides agree on.
    public var userInfo: [String: PlistValue]
    /// Open files, passed as descriptors rather than copied through the socket (at most 64 per message, all
    /// items together).
    public var fileAttachments: [FileAttachment]

    /// Creates an item.
    public init(title: String? = nil, text: String? = nil, attachments: [PlistValue] = [],
                userInfo: [String: PlistValue] = [:], fileAttachments: [FileAttachment] = [])
    {
        self.title = title
        self.text = text
        self.attachments = attachments
        self.userInfo = userInfo
        self.fileAttachments = fileAttachments
    }

    /// `ExtensionItem(title: "hi", text: "…", attachments: 2 values, files: 1, userInfo: [keys])`: what it holds,
    /// with long text cut and file attachments counted, not read.
    public var description: String {
        func quoted(_ s: String) -> String { "\"" + (s.count > 60 ? String(s.prefix(59)) + "…" : s) + "\"" }
        var parts: [String] = []
        if let title { parts.append("title: " + quoted(title)) }
        if let text { parts.append("text: " + quoted(text)) }
        if !attachments.isEmpty { parts.append("attachments: \(attachments.count) value\(attachments.count == 1 ? "" : "s")") }
        if !fileAttachments.isEmpty {
            parts.append("files: " + fileAttachments.map { "\($0.size) bytes" }.joined(separator: ", "))
        }
        if !userInfo.isEmpty { parts.append("userInfo: [" + userInfo.keys.sorted().joined(separator: ", ") + "]") }
        return "ExtensionItem(" + parts.joined(separator: ", ") + ")"
    }

    /// An item that carries `value` as its one attachment, encoded with `PlistValueEncoder`.
    ///
    /// - Throws: `EncodingError` for a value a property list cannot hold.
    public init<T: Encodable>(encoding value: T, title: String? = nil) throws {
        self.init(title: title, attachments: [try PlistValueEncoder().encode(value)])
    }

    /// The item's first payload value (`attachments`) decoded as `T`: the inverse of `init(encoding:)`. Files
    /// (`fileAttachments`) are not payloads: read them with `FileAttachment`.
    ///
    /// - Throws: `DecodingError` when there is no payload value or it does not decode as `T`.
    public func decode<T: Decodable>(_ type: T.Type) throws -> T {
        guard let first = attachments.first else {
            let files = fileAttachments.isEmpty ? "" : "; it carries \(fileAttachments.count) file(s) in fileAttachments, "
                + "which are read with FileAttachment, not decoded"
            throw DecodingError.valueNotFound(type, .init(codingPath: [], debugDescription:
                "the item has no payload value (its attachments are empty) to decode as \(T.self)\(files)"))
        }
        return try PlistValueDecoder().decode(type, from: first)
    }

    /// The wire form, its file attachments numbered from 0 (within a message, from where the previous item's
    /// ended).
    public var plist: PlistValue {
        var next = 0
        return plist(numberingFilesFrom: &next)
    }

    func plist(numberingFilesFrom next: inout Int) -> PlistValue {
        var d = [String: PlistValue](fields: [.attachments: .array(attachments), .userInfo: .dictionary(userInfo)])
        if let title { d[.title] = .string(title) }
        if let text { d[.text] = .string(text) }
        if !fileAttachments.isEmpty {
            d[.files] = .array((next..<next + fileAttachments.count).map { .integer(Int64($0)) })
            next += fileAttachments.count
        }
        return .dictionary(d)
    }

    /// Parses the wire form; missing `attachments`/`userInfo` mean empty. `files` resolves the item's `files`
    /// indices (the descriptors of its message).
    public init(plist: PlistValue, files: [FileAttachment] = []) throws(MessageError) {
        guard case .dictionary(let d) = plist else { throw MessageError("item is a \(plist.kindName), not a dictionary") }
        switch d[.files] {
        case nil: fileAttachments = []
        case .array(let indices)?:
            var resolved: [FileAttachment] = []
            for index in indices {
                guard let i = index.integerValue, i >= 0, i < files.count else {
                    throw MessageError("item files entry \(index) does not name one of the message's \(files.count) descriptor(s)")
                }
                resolved.append(files[Int(i)])
            }
            fileAttachments = resolved
        case let other?: throw MessageError("item files is a \(other.kindName), not an array")
        }
        func optionalString(_ key: MessageKey) throws(MessageError) -> String? {
            switch d[key] {
            case nil: return nil
            case .string(let s)?: return s
            case let other?: throw MessageError("item \(key.rawValue) is a \(other.kindName), not a string")
            }
        }
        title = try optionalString(.title)
        text = try optionalString(.text)
        switch d[.attachments] {
        case nil: attachments = []
        case .array(let a)?: attachments = a
        case let other?: throw MessageError("item attachments is a \(other.kindName), not an array")
        }
        switch d[.userInfo] {
        case nil: userInfo = [:]
        case .dictionary(let u)?: userInfo = u
        case let other?: throw MessageError("item userInfo is a \(other.kindName), not a dictionary")
        }
    }
}
