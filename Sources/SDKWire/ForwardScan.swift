// The daemon's check of a frame it forwards (a client's `begin` to a worker, a worker's `complete` to a client)
// without decoding it. Forwarding sends the payload on byte for byte, so the daemon only needs to know that the
// receiver will accept it and the few fields it acts on; building the items' `PlistValue` tree to learn that was
// most of the daemon's work per request.
//
// `ForwardScan.scan` walks the payload with the decoder's own reader (`skim`), charging every object to the same
// budgets in the same order as `ForwardScan.decode` (which its receiver reads it with), and checks the message's
// shape as `Message(plist:)` and `ExtensionItem(plist:)` would. So a payload it accepts decodes, and parses as the
// same message. The walk charges each item an `ExtensionItem` and builds no dictionary for the message or an item
// and no array of the items, so it charges those nothing (a decode does: at most the decode's charge and the
// items' together). It accepts a
// strict subset of valid messages and returns nil for the rest, which the caller decodes as before:
//   - anything that does not decode, or is not a `begin`, `complete` or `partial` (a `partial` is scanned so that
//     its receiver knows to decode it this way: the daemon does not forward one unread);
//   - a message with `fds` or an item with `files` (descriptors travel with a re-encoded frame);
//   - a top-level key given twice, a UTF-16 key in the message or an item, or an `id` not written as the
//     36-byte ASCII string object that `ForwardedFrame` rewrites in place.
//
// `ForwardScan.isStatusReport` checks a `statusReport` the same way for a reader that never looks inside one (the
// simulation's clients): it takes a strict subset of what decodes as one, and builds nothing.
//
// `ForwardScan.decode` is the same walk for a receiver that wants the message (a `begin`, `complete` or `partial`): it builds the items' titles,
// texts, attachments and userInfo as a decode would, and the message and items from them directly, so the
// messages sent per request are parsed without hashing their keys into dictionaries first. Given the descriptors
// that arrived, it also takes a message with `fds` and items with `files`, resolving them as
// `IncomingDescriptors.message(from:)` does; any `fds` or `files` entry that is not an integer in range is left
// to that path, which reports it.

/// What the daemon needs of a `begin` or `complete` it forwards unread (a `partial` it decodes: `ForwardScan.decode`).
package struct ScannedMessage: Sendable, Equatable {
    package enum Kind: Sendable, Equatable { case begin, complete, partial }
    package let kind: Kind
    package let id: RequestID
    /// Where the id's 36 ASCII bytes are in the payload.
    package let idRange: Range<Int>
    /// A `begin`'s `extension`, if it has one.
    package let extensionID: String?
    /// A `begin`'s `deadlineMs`, if it has one.
    package let deadlineMs: Int64?
    /// What the message is charged as its receiver reads it (`ForwardScan.decode`).
    package let decodedBytes: Int
}

package enum ForwardScan {
    /// The message `payload` holds, if it is a `begin` or `complete` that can be forwarded without decoding it,
    /// or a `partial` (which its receiver then builds with `decode`); nil when it must be decoded (see the file
    /// header), including every payload that is not valid.
    package static func scan(_ payload: UnsafeRawBufferPointer, limits: WireLimits) -> ScannedMessage? {
        var items: [ExtensionItem]? = nil
        var descriptors: DescriptorFields? = nil
        guard let (fields, charged) = walk(payload, limits: limits, building: &items, descriptors: &descriptors),
            ForwardedFrame.idStandsAlone(in: payload, at: fields.idRange)
        else { return nil }
        return fields.message(decodedBytes: charged)
    }

    /// The `begin`, `complete` or `partial` in `payload` decoded by the same walk as `scan`, building the items' values
    /// but not the message's or the items' own dictionaries (their keys were hashed into a Swift Dictionary
    /// only to be looked up once). It takes what `scan` takes and returns nil for the rest, which the caller
    /// decodes as before; `decodedBytes` is what the walk charged (what it built; see the file header).
    package static func decode(_ payload: UnsafeRawBufferPointer, limits: WireLimits, decodedBytes: inout Int)
        -> Message?
    {
        var noDescriptors: DescriptorFields? = nil
        return decode(payload, limits: limits, decodedBytes: &decodedBytes, descriptors: &noDescriptors, available: [])
    }

    /// `decode` for a frame whose descriptors may have arrived: `available` are those received and not yet claimed,
    /// oldest first. A message with `fds` n claims the first n of them, and its items' `files` name them by index,
    /// as `IncomingDescriptors.message(from:)` resolves them. Returns the message and how many it claims; nil for
    /// what that path must decide, including every `fds` or `files` it would refuse.
    package static func decode(_ payload: UnsafeRawBufferPointer, limits: WireLimits, decodedBytes: inout Int,
                                available: [FileAttachment]) -> (message: Message, claimed: Int)? {
        var descriptors: DescriptorFields? = DescriptorFields()
        guard let message = decode(payload, limits: limits, decodedBytes: &decodedBytes, descriptors: &descriptors,
                                   available: available)
        else { return nil }
        return (message, descriptors!.count)
    }

    private static func decode(_ payload: UnsafeRawBufferPointer, limits: WireLimits, decodedBytes: inout Int,
                               descriptors: inout DescriptorFields?, available: [FileAttachment]) -> Message? {
        var built: [ExtensionItem]? = []
        guard let (fields, charged) = walk(payload, limits: limits, building: &built, descriptors: &descriptors),
            var items = built
        else { return nil }
        if let descriptors {
            // As `Message.descriptorCount(of:)` and `ExtensionItem(plist:files:)`: the count is what arrived at most,
            // and every index names one of the claimed.
            guard descriptors.count <= available.count else { return nil }
            for (item, indices) in descriptors.itemFiles {
                var resolved: [FileAttachment] = []
                resolved.reserveCapacity(indices.count)
                for i in indices {
                    guard i >= 0, i < descriptors.count else { return nil }
                    resolved.append(available[Int(i)])
                }
                items[item].fileAttachments = resolved
            }
        }
        decodedBytes = charged
        switch fields.kind {
        case .begin:
            return .begin(id: fields.id, items: items, extensionID: fields.extensionID, deadlineMs: fields.deadlineMs)
        case .complete:
            return .complete(id: fields.id, items: items)
        case .partial:
            return .partial(id: fields.id, items: items)
        }
    }

    /// Whether `payload` is a `statusReport` without descriptors that a decode would accept: every object is
    /// checked as the decoder checks it, building nothing. For a reader that never looks inside a report (the
    /// simulation's clients); false for anything else, which the caller decodes as usual.
    package static func isStatusReport(_ payload: UnsafeRawBufferPointer, limits: WireLimits) -> Bool {
        guard var reader = try? BinaryPlistReader(payload, limits: limits) else { return false }
        return withUnsafeTemporaryAllocation(of: Bool.self, capacity: reader.objectCount) { onPath in
            onPath.initialize(repeating: false)
            reader.onPath = onPath
            return (try? reader.isStatusReport()) == true
        }
    }

    /// The walk both share: the fields, and what a decode would charge, or nil.
    private static func walk(_ payload: UnsafeRawBufferPointer, limits: WireLimits, building items: inout [ExtensionItem]?,
                             descriptors: inout DescriptorFields?) -> (ForwardableFields, decodedBytes: Int)?
    {
        guard var reader = try? BinaryPlistReader(payload, limits: limits) else { return nil }
        let budget = reader.byteBudget
        return withUnsafeTemporaryAllocation(of: Bool.self, capacity: reader.objectCount) { onPath in
            onPath.initialize(repeating: false)
            reader.onPath = onPath
            guard let fields = try? reader.forwardableFields(building: &items, descriptors: &descriptors) else { return nil }
            return (fields, budget - reader.byteBudget)
        }
    }
}

extension BinaryPlistReader {
    /// `ForwardScan.isStatusReport`: the type is looked at first, so another message costs a few headers. Each
    /// of `type`, `seq` and `report` once (`type` the name, `seq` an integer, `report` anything, as
    /// `Message(plist:)` requires), no `fds`, ASCII keys only; then every object, as a decode checks it.
    mutating func isStatusReport() throws(WireError) -> Bool {
        let top = topObject
        guard case .dictionary(let n, let start) = try header(of: top) else { return false }
        var isReport = false, seqs = 0, reports = 0
        for i in 0..<n {
            guard case .ascii(let keyRange) = try header(of: try ref(at: start + i * refSize)) else { return false }
            let value = try ref(at: start + (n + i) * refSize)
            switch MessageKey(ascii: UnsafeRawBufferPointer(rebasing: base[keyRange])) {
            case .type?:
                guard !isReport, case .ascii(let r) = try header(of: value),
                    UnsafeRawBufferPointer(rebasing: base[r]).spells(MessageType.statusReport.staticName)
                else { return false }
                isReport = true
            case .seq?:
                guard case .integer = try header(of: value) else { return false }
                seqs += 1
            case .report?: reports += 1
            case .fds?: return false
            default: break
            }
        }
        guard isReport, seqs == 1, reports == 1 else { return false }
        try skim(object: top, depth: 0)
        return true
    }
}

/// The top-level fields `forwardableFields` found, as payload ranges until the message is known to be whole.
struct ForwardableFields {
    var kind: ScannedMessage.Kind
    var id: RequestID
    var idRange: Range<Int>
    var extensionID: String?
    var deadlineMs: Int64?

    func message(decodedBytes: Int) -> ScannedMessage {
        ScannedMessage(kind: kind, id: id, idRange: idRange, extensionID: extensionID, deadlineMs: deadlineMs,
                       decodedBytes: decodedBytes)
    }
}

/// A message's descriptors as the walk reads them when it may carry some (`ForwardScan.decode(_:limits:decodedBytes:
/// available:)`): its `fds`, and the `files` indices of each item built, by the item's position.
struct DescriptorFields {
    var count = 0
    var itemFiles: [(item: Int, indices: [Int64])] = []
}

extension UnsafeRawBufferPointer {
    /// Whether these bytes are `name`'s (the key and type checks of the scanner and of FlatFrame).
    @inline(__always)
    func spells(_ name: StaticString) -> Bool {
        guard count == name.utf8CodeUnitCount else { return false }
        let bytes = name.utf8Start
        for i in 0..<count where self[i] != bytes[i] { return false }
        return true
    }
}

private enum TopKey: Int {
    case type, id, items, extensionID, deadlineMs, fds, other

    init(_ key: UnsafeRawBufferPointer) {
        switch key.count {
        case 2 where key.spells(MessageKey.id.staticName): self = .id
        case 3 where key.spells(MessageKey.fds.staticName): self = .fds
        case 4 where key.spells(MessageKey.type.staticName): self = .type
        case 5 where key.spells(MessageKey.items.staticName): self = .items
        case 9 where key.spells(MessageKey.`extension`.staticName): self = .extensionID
        case 10 where key.spells(MessageKey.deadlineMs.staticName): self = .deadlineMs
        default: self = .other
        }
    }
}

private enum ItemKey {
    case title, text, attachments, userInfo, files, other

    init(_ key: UnsafeRawBufferPointer) {
        switch key.count {
        case 4 where key.spells(MessageKey.text.staticName): self = .text
        case 5 where key.spells(MessageKey.title.staticName): self = .title
        case 5 where key.spells(MessageKey.files.staticName): self = .files
        case 8 where key.spells(MessageKey.userInfo.staticName): self = .userInfo
        case 11 where key.spells(MessageKey.attachments.staticName): self = .attachments
        default: self = .other
        }
    }
}

/// Thrown inside the scan for a valid payload the fast path does not take; the caller only sees nil.
private let notForwardable = WireError(.invalidObject, "not forwardable unread")

extension BinaryPlistReader {
    /// Walks the whole payload as `value(object: topObject, depth: 0)` would, returning the message's fields if
    /// it is a forwardable `begin` or `complete`, or a `partial`. With `items` non-nil, the items are built into it
    /// as well.
    /// With `descriptors` non-nil (and `items` being built), `fds` and the items' `files` are read into it: an
    /// `fds` that is an integer in 0...`maxDescriptorsPerMessage`, `files` that are arrays of integers.
    mutating func forwardableFields(building items: inout [ExtensionItem]?, descriptors: inout DescriptorFields?)
        throws(WireError) -> ForwardableFields?
    {
        let top = topObject
        guard case .dictionary(let n, let start) = try header(of: top) else { return nil }
        try enter(object: top, depth: 0)
        var seen = 0
        var kind: ScannedMessage.Kind?, id: (RequestID, Range<Int>)?, itemsSeen = false
        var extensionID: String?, deadlineMs: Int64?
        for i in 0..<n {
            let keyObject = try ref(at: start + i * refSize)
            guard case .ascii(let keyRange) = try header(of: keyObject) else { return nil }
            let key = TopKey(UnsafeRawBufferPointer(rebasing: base[keyRange]))
            let valueObject = try ref(at: start + (n + i) * refSize)
            if key != .other {
                guard seen & (1 << key.rawValue) == 0 else { return nil }
                seen |= 1 << key.rawValue
            }
            switch key {
            case .type:
                guard case .ascii(let r) = try header(of: valueObject) else { return nil }
                let text = UnsafeRawBufferPointer(rebasing: base[r])
                if text.spells(MessageType.begin.staticName) {
                    kind = .begin
                } else if text.spells(MessageType.complete.staticName) {
                    kind = .complete
                } else if text.spells(MessageType.partial.staticName) {
                    kind = .partial
                } else {
                    return nil
                }
            case .id:
                // Exactly the form ForwardedFrame rewrites: 0x5F, a one-byte integer 36, 36 ASCII bytes.
                guard case .ascii(let r) = try header(of: valueObject), r.count == 36,
                    base[r.lowerBound - 3] == 0x5F, base[r.lowerBound - 2] == 0x10, base[r.lowerBound - 1] == 36,
                    let parsed = RequestID(uuidBytes: UnsafeRawBufferPointer(rebasing: base[r]))
                else { return nil }
                id = (parsed, r)
            case .extensionID:
                guard case .ascii(let r) = try header(of: valueObject) else { return nil }
                extensionID = String(decoding: UnsafeRawBufferPointer(rebasing: base[r]), as: UTF8.self)
            case .deadlineMs:
                guard case .integer(let v) = try header(of: valueObject) else { return nil }
                deadlineMs = v
            case .items:
                try forwardableItems(valueObject, building: &items, descriptors: &descriptors)
                itemsSeen = true
            case .fds:
                guard descriptors != nil, case .integer(let v) = try header(of: valueObject), v >= 0,
                    v <= Int64(maxDescriptorsPerMessage)
                else { return nil }
                descriptors!.count = Int(v)
            case .other:
                try skim(object: valueObject, depth: 1)
            }
        }
        onPath[top] = false
        guard let kind, let id, itemsSeen else { return nil }
        if kind != .begin { (extensionID, deadlineMs) = (nil, nil) }
        return ForwardableFields(kind: kind, id: id.0, idRange: id.1, extensionID: extensionID, deadlineMs: deadlineMs)
    }

    /// The `items` array at depth 1: each a dictionary that `ExtensionItem(plist:)` accepts, with no `files`
    /// unless `descriptors` is non-nil (then their indices go there, the last occurrence of the key standing).
    /// With `built` non-nil, each item is appended to it as `ExtensionItem(plist:)` would make it.
    private mutating func forwardableItems(_ object: Int, building built: inout [ExtensionItem]?,
                                           descriptors: inout DescriptorFields?) throws(WireError) {
        guard case .array(let count, let start) = try header(of: object) else { throw notForwardable }
        try enter(object: object, depth: 1)
        let building = built != nil
        if building { built!.reserveCapacity(count) }
        for i in 0..<count {
            let item = try ref(at: start + i * refSize)
            guard case .dictionary(let n, let entries) = try header(of: item) else { throw notForwardable }
            // What the receiver builds of it, charged whether built here or not: a forwarded frame is refused
            // where its reader would refuse it.
            try charge(Self.itemCost, for: item)
            try enter(object: item, depth: 2)
            var made = ExtensionItem()
            var files: [Int64]?
            for k in 0..<n {
                guard case .ascii(let keyRange) = try header(of: try ref(at: entries + k * refSize)) else {
                    throw notForwardable
                }
                let valueObject = try ref(at: entries + (n + k) * refSize)
                // Every occurrence of a key is checked, and a later one replaces an earlier, as in a decoded
                // dictionary.
                let key = ItemKey(UnsafeRawBufferPointer(rebasing: base[keyRange]))
                switch key {
                case .title, .text:
                    guard building else {
                        switch try skim(object: valueObject, depth: 3) {
                        case .ascii, .utf16: continue
                        default: throw notForwardable
                        }
                    }
                    guard case .string(let text) = try value(object: valueObject, depth: 3) else { throw notForwardable }
                    if key == .title { made.title = text } else { made.text = text }
                case .attachments:
                    guard building else {
                        guard case .array = try skim(object: valueObject, depth: 3) else { throw notForwardable }
                        continue
                    }
                    guard case .array(let values) = try value(object: valueObject, depth: 3) else { throw notForwardable }
                    made.attachments = values
                case .userInfo:
                    guard building else {
                        guard case .dictionary = try skim(object: valueObject, depth: 3) else { throw notForwardable }
                        continue
                    }
                    guard case .dictionary(let values) = try value(object: valueObject, depth: 3) else { throw notForwardable }
                    made.userInfo = values
                case .files:
                    guard building, descriptors != nil,
                        case .array(let values) = try value(object: valueObject, depth: 3)
                    else { throw notForwardable }
                    var indices: [Int64] = []
                    indices.reserveCapacity(values.count)
                    for v in values {
                        guard case .integer(let index) = v else { throw notForwardable }
                        indices.append(index)
                    }
                    files = indices
                case .other:
                    try skim(object: valueObject, depth: 3)
                }
            }
            onPath[item] = false
            if let files, !files.isEmpty { descriptors!.itemFiles.append((built!.count, files)) }
            if building { built!.append(made) }
        }
        onPath[object] = false
    }
}
