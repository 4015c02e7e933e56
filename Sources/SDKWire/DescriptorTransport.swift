// Descriptors beside frames (Messages.swift, "Descriptors"), the bookkeeping both ends of a connection share:
// the host's FramedConnection (non-blocking) and the worker runtime (blocking) move the bytes themselves and ask
// these two types where descriptors go on the way out and which frame they belong to on the way in.

/// The sending side: where in a queue of frame bytes each frame that carries descriptors starts, with them (they
/// stay open until written).
package struct OutgoingDescriptors {
    private var marks: [(offset: Int, files: [FileAttachment])] = []
    /// Descriptors queued and not yet written.
    package private(set) var queuedCount = 0

    package init() {}

    /// Encodes `message` as a frame appended to `bytes`, noting its descriptors.
    ///
    /// - Throws: `WireError` for a frame over `limits`, or more than 64 descriptors; nothing is appended then.
    package mutating func encode(_ message: Message, with encoder: inout BinaryPlistEncoder, appendingTo bytes: inout [UInt8],
                                 limits: WireLimits = .default) throws(WireError)
    {
        if let flat = message.flatFields {
            try Frame.append(to: &bytes, limits: limits) { FlatFrame.appendPayload(flat, to: &$0, limit: limits.maxFrameBytes) }
            return
        }
        let start = bytes.count
        let files = message.fileAttachments
        if files.count > maxDescriptorsPerMessage {
            throw WireError(.notEncodable, "\(files.count) file attachments in one message; at most \(maxDescriptorsPerMessage)")
        }
        if let fields = ItemsFields(message) {
            try Frame.append(to: &bytes, limits: limits) { encoder.encode(fields, appendingTo: &$0, limit: limits.maxFrameBytes) }
        } else {
            try Frame.encode(message.plist, with: &encoder, appendingTo: &bytes, limits: limits)
        }
        // Nesting the receiver must refuse is not sent (it would be the receiver's protocol error, a worker's exit
        // charged to the extension): for the rare message whose items nest deep, the frame is read as the
        // receiver will read it. Its items sit a few levels down, so the walk stops short of the limit.
        if message.itemsNest(max(limits.maxDepth - 16, 1)) {
            var charged = 0
            let checked = bytes[(start + 4)...].withUnsafeBytes { payload in
                Result { () throws(WireError) in _ = try BinaryPlistDecoder.decode(payload, limits: limits, decodedBytes: &charged) }
            }
            if case .failure(let error) = checked, error.code == .tooDeep {
                bytes.removeSubrange(start...)
                throw error
            }
        }
        if !files.isEmpty {
            marks.append((start, files))
            queuedCount += files.count
        }
    }

    /// Takes `other`'s descriptors, for frames `other` encoded into a buffer of their own that is appended at
    /// `offset` of the bytes this one tracks.
    package mutating func append(_ other: OutgoingDescriptors, at offset: Int) {
        for mark in other.marks { marks.append((offset + mark.offset, mark.files)) }
        queuedCount += other.queuedCount
    }

    /// The next write of the queued bytes from `sent` to `count`: up to the next frame that carries descriptors,
    /// or, when one starts at `sent`, that frame with its descriptors (up to the next such frame).
    package func nextWrite(from sent: Int, upTo count: Int) -> (end: Int, descriptors: [Int32]) {
        guard let next = marks.first else { return (count, []) }
        guard next.offset == sent else { return (next.offset, []) }
        return (marks.count > 1 ? marks[1].offset : count, next.files.map { $0.rawDescriptor })
    }

    /// A write from `sent` put at least one byte on the wire: the descriptors of a frame starting there went with
    /// it.
    package mutating func wrote(from sent: Int) {
        if marks.first?.offset == sent { queuedCount -= marks.removeFirst().files.count }
    }

    /// The first `count` bytes, all written, were dropped from the front of the bytes this one tracks.
    package mutating func dropWritten(_ count: Int) {
        for i in marks.indices { marks[i].offset -= count }
    }

    /// Forgets every mark (the bytes were dropped); the descriptors close unless held elsewhere.
    package mutating func removeAll() {
        marks = []
        queuedCount = 0
    }
}

/// The receiving side: descriptors received and not yet claimed by a complete frame, oldest first, each owned
/// by a FileAttachment from the moment it arrives.
package struct IncomingDescriptors {
    private var files: [FileAttachment] = []
    /// How many descriptors the last message read (`message(from:)`, `decodeDirectly`, `nextMessage`) claimed.
    package private(set) var lastClaimed = 0

    package init() {}

    /// Takes ownership of `raw` (emptied), just received. Returns why the connection must end, or nil: the kernel
    /// cut descriptors off (`truncated`), or one is not a regular file or memfd. They are owned either way.
    package mutating func adopt(_ raw: inout [Int32], truncated: Bool) -> String? {
        var problem: String? = truncated
            ? "a message brought more than \(maxDescriptorsPerMessage) descriptors, or control data other than descriptors" : nil
        for fd in raw {
            if problem == nil, let what = FileAttachment.refusedOnReceipt(fd) { problem = "a descriptor attachment is \(what)" }
            files.append(FileAttachment(adopting: fd))
        }
        raw.removeAll(keepingCapacity: true)
        return problem
    }

    /// The message a complete frame's payload is, with as many descriptors from the front of the queue as it
    /// says it carries. `decodedBytes` is what decoding `plist` was charged: the items the message will hold are
    /// added to it (as `ForwardScan`'s walk charges them), and must fit in `budget` (the payload's
    /// `WireLimits.decodedBytesBudget`) before one is built.
    ///
    /// - Throws: `MessageError` for an invalid message, one whose items do not fit in the budget, or one that
    ///   claims more descriptors than arrived.
    package mutating func message(from plist: PlistValue, decodedBytes: inout Int, budget: Int) throws(MessageError)
        -> Message
    {
        if case .dictionary(let fields) = plist, case .array(let items)? = fields[.items] {
            decodedBytes += items.count * BinaryPlistReader.itemCost
            guard decodedBytes <= budget else {
                throw MessageError("its \(items.count) items would take \(decodedBytes) bytes decoded; the budget is \(budget)")
            }
        }
        let count = try Message.descriptorCount(of: plist)
        lastClaimed = count
        if count == 0 { return try Message(plist: plist) }
        guard count <= files.count else {
            throw MessageError("the frame says it carries \(count) descriptor(s), and \(files.count) arrived")
        }
        let claimed = Array(files.prefix(count))
        files.removeFirst(count)
        return try Message(plist: plist, files: claimed)
    }

    /// `payload` as a `begin`, `complete` or `partial` read without a `PlistValue` tree (`ForwardScan.decode`),
    /// claiming the descriptors its `fds` says it carries as `message(from:)` would; nil, with nothing claimed,
    /// for what must be decoded and parsed (and any error reported) that way.
    package mutating func decodeDirectly(_ payload: UnsafeRawBufferPointer, limits: WireLimits, decodedBytes: inout Int)
        -> Message?
    {
        guard let (message, claimed) = ForwardScan.decode(payload, limits: limits, decodedBytes: &decodedBytes, available: files)
        else { return nil }
        lastClaimed = claimed
        if claimed > 0 { files.removeFirst(claimed) }
        return message
    }

    /// The next whole frame in `reader` as a message, or nil when none is buffered. The flat messages as we
    /// write them (`FlatFrame`), and a `begin`, `complete` or `partial` with or without descriptors, are read
    /// without a `PlistValue` tree; anything else is decoded and then parsed.
    ///
    /// Without `buildingBeginItems`, a `begin` without descriptors comes with no items, its id and fields checked
    /// as the daemon's forwarding checks them (the simulation's fake workers, which only record the id).
    ///
    /// - Throws: `WireError` for a frame that does not decode, `MessageError` for an invalid message.
    package mutating func nextMessage(from reader: inout FrameReader, buildingBeginItems: Bool = true) throws -> Message? {
        let limits = reader.limits
        var direct: Message?
        var charged = 0, budget = 0
        guard let decoded = try reader.withNextPayload({ payload throws(WireError) -> PlistValue? in
            direct = FlatFrame.message(from: payload)
            if direct == nil, !buildingBeginItems, let scanned = ForwardScan.scan(payload, limits: limits), scanned.kind == .begin {
                direct = .begin(id: scanned.id, items: [], extensionID: scanned.extensionID, deadlineMs: scanned.deadlineMs)
            }
            if direct != nil {
                lastClaimed = 0
                return nil
            }
            // Claims its descriptors, if it is taken.
            direct = decodeDirectly(payload, limits: limits, decodedBytes: &charged)
            guard direct == nil else { return nil }
            budget = limits.decodedBytesBudget(payloadBytes: payload.count)
            return try BinaryPlistDecoder.decode(payload, limits: limits, decodedBytes: &charged)
        }) else { return nil }
        if let direct { return direct }
        return try message(from: decoded!, decodedBytes: &charged, budget: budget)
    }

    /// A message that carries no descriptors was taken without `message(from:)` (a forwarded frame).
    package mutating func claimedNone() { lastClaimed = 0 }

    /// After the complete frames are delivered: why the descriptors left over cannot be right, or nil.
    /// Descriptors come with their frame's first byte, so with no frame half-read none may be left, and a
    /// half-read frame has at most one message's worth.
    package func unclaimedProblem(frameHalfRead: Bool) -> String? {
        files.count > (frameHalfRead ? maxDescriptorsPerMessage : 0)
            ? "\(files.count) descriptor(s) arrived that no frame claims" : nil
    }

    /// Closes every descriptor still queued.
    package mutating func removeAll() { files = [] }
}
