// The request's identity and its unit of input and output: RequestID (a UUID on the wire) and ExtensionItem
// (NSExtensionItem's shape, plus file attachments). Their wire forms are described in Messages.swift.

import CSDKShim
import Synchronization

/// Identifies one request. Random 128 bits, written as a UUID string on the wire.
public struct RequestID: Hashable, Sendable, CustomStringConvertible {
    /// The high and low 64 bits.
    public let high: UInt64, low: UInt64

    /// A new random (version 4) identifier.
    public init() {
        // From the shim's per-thread pool: one getrandom call per 16 ids (the generator makes one per 64 bits), as
        // a request id is made on every beginRequest.
        var words: (UInt64, UInt64) = (0, 0)
        let filled = withUnsafeMutableBytes(of: &words) { sdk_random_16($0.baseAddress) == 0 }
        if filled {
            self.init(high: words.0, low: words.1)
        } else {
            var g = SystemRandomNumberGenerator()
            self.init(high: g.next(), low: g.next())
        }
    }

    /// A new identifier distinct from every other this process made this way, without a system call: a random
    /// 128-bit key drawn once, with a counter in the low 62 bits. Predictable within the process, so only for ids
    /// that need to be distinct and are never shown to another party as a secret: the daemon's ids for the requests
    /// it forwards to its workers (a worker can complete only what was sent to it).
    package static func distinct() -> RequestID {
        let n = distinctCounter.add(1, ordering: .relaxed).newValue
        return RequestID(high: distinctKey.high, low: distinctKey.low ^ (n & (1 << 62 - 1)))
    }

    init(high: UInt64, low: UInt64) {
        // Version 4, RFC 4122 variant.
        self.high = (high & ~0xF000) | 0x4000
        self.low = (low & ~(UInt64(0xC) << 60)) | (UInt64(0x8) << 60)
    }

    /// Parses the 36-character UUID form; nil for anything else.
    public init?(uuidString s: String) {
        var s = s
        guard let id = s.withUTF8({ RequestID(uuidBytes: UnsafeRawBufferPointer($0)) }) else { return nil }
        self = id
    }

    /// Parses the 36 ASCII bytes of the UUID form, in either case; nil for anything else.
    package init?(uuidBytes u: UnsafeRawBufferPointer) {
        // Table-driven and branch-free per digit (every id of every message is parsed: the first version's
        // per-character switch was 7% of a daemon client's loop thread under load). A byte that is not a hex
        // digit maps to 0x10, which the OR of all digits catches at the end.
        guard u.count == 36, u[8] == UInt8(ascii: "-"), u[13] == UInt8(ascii: "-"), u[18] == UInt8(ascii: "-"),
            u[23] == UInt8(ascii: "-")
        else { return nil }
        var high: UInt64 = 0, low: UInt64 = 0, seen: UInt8 = 0
        Self.hexDigits.withUnsafeBufferPointer { table in
            // The digits' offsets: 8, 4, 4 before the dash at 18 (the high word), then 4 and 12.
            for i in 0..<36 where i != 8 && i != 13 && i != 18 && i != 23 {
                let v = table[Int(u[i])]
                seen |= v
                if i < 18 { high = high << 4 | UInt64(v) } else { low = low << 4 | UInt64(v) }
            }
        }
        guard seen & 0x10 == 0 else { return nil }
        self.high = high
        self.low = low
    }

    /// Each byte's hex value, or 0x10 for a byte that is not a hex digit.
    private static let hexDigits: [UInt8] = (0..<256).map { c -> UInt8 in
        switch UInt8(c) {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): UInt8(c) &- UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): UInt8(c) &- UInt8(ascii: "a") &+ 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): UInt8(c) &- UInt8(ascii: "A") &+ 10
        default: 0x10
        }
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
        precondition(out.count >= 36)
        var j = 0
        for i in 0..<32 {
            if i == 8 || i == 12 || i == 16 || i == 20 {
                out[j] = UInt8(ascii: "-")
                j += 1
            }
            let word = i < 16 ? high : low
            let nibble = UInt8(truncatingIfNeeded: (word >> UInt64(60 - (i % 16) * 4)) & 0xF)
            out[j] = nibble < 10 ? nibble &+ UInt8(ascii: "0") : nibble &+ (UInt8(ascii: "A") &- 10)
            j += 1
        }
    }

    public var description: String { uuidString }
}

private let distinctKey = RequestID()
private let distinctCounter = Atomic<UInt64>(0)

/// One unit of input or output, modelled on NSExtensionItem.
public struct ExtensionItem: Equatable, Sendable {
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

    /// An item that carries `value` as its one attachment, encoded with `PlistValueEncoder`.
    ///
    /// - Throws: `EncodingError` for a value a property list cannot hold.
    public init<T: Encodable>(encoding value: T, title: String? = nil) throws {
        self.init(title: title, attachments: [try PlistValueEncoder().encode(value)])
    }

    /// The item's first attachment decoded as `T`: the inverse of `init(encoding:)`.
    ///
    /// - Throws: `DecodingError` when there is no attachment or it does not decode as `T`.
    public func decode<T: Decodable>(_ type: T.Type) throws -> T {
        guard let first = attachments.first else {
            throw DecodingError.valueNotFound(type, .init(codingPath: [], debugDescription: "the item has no attachment to decode"))
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
        var d: [String: PlistValue] = ["attachments": .array(attachments), "userInfo": .dictionary(userInfo)]
        if let title { d["title"] = .string(title) }
        if let text { d["text"] = .string(text) }
        if !fileAttachments.isEmpty {
            d["files"] = .array((next..<next + fileAttachments.count).map { .integer(Int64($0)) })
            next += fileAttachments.count
        }
        return .dictionary(d)
    }

    /// Parses the wire form; missing `attachments`/`userInfo` mean empty. `files` resolves the item's `files`
    /// indices (the descriptors of its message).
    public init(plist: PlistValue, files: [FileAttachment] = []) throws(MessageError) {
        guard case .dictionary(let d) = plist else { throw MessageError("item is a \(plist.kindName), not a dictionary") }
        switch d["files"] {
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
        func optionalString(_ key: String) throws(MessageError) -> String? {
            switch d[key] {
            case nil: return nil
            case .string(let s)?: return s
            case let other?: throw MessageError("item \(key) is a \(other.kindName), not a string")
            }
        }
        title = try optionalString("title")
        text = try optionalString("text")
        switch d["attachments"] {
        case nil: attachments = []
        case .array(let a)?: attachments = a
        case let other?: throw MessageError("item attachments is a \(other.kindName), not an array")
        }
        switch d["userInfo"] {
        case nil: userInfo = [:]
        case .dictionary(let u)?: userInfo = u
        case let other?: throw MessageError("item userInfo is a \(other.kindName), not a dictionary")
        }
    }
}
