// How the simulation's peers (its fake workers and daemon clients) read and write frames.
//   - `SocketInbox` takes frames and descriptors off a peer's socket.
//   - `FramePeek` reads what a peer needs of a frame the engine or the daemon sent it: the message's type and its
//     `id` or `seq`, found in the top dictionary without building the message. The peers are the simulation's,
//     not the code under test: what they must know is which request a frame is about, and every frame they get
//     was written by our own encoder. A frame that brings descriptors (`fds`), or that the peek does not read,
//     is decoded in full, so the files a begin or a completion brings are claimed as the runtime and the client
//     library claim them. Decoding every frame in full was ~12% of a schedule's instructions.
//   - `ReplyTemplates` keeps the frames of the replies fake workers send again and again.
import SDKWire
import SDKPosix
import CSDKShim

#if canImport(Glibc)
import Glibc
#endif

/// The fields a peer acts on.
struct PeekedFrame {
    let type: MessageType
    let id: RequestID?
    let seq: Int64?
}

enum FramePeek {
    /// `payload`'s type and id or seq, if it is a bplist00 dictionary this reads, with a `type` and no `fds`;
    /// nil otherwise (the caller decodes it in full).
    static func peek(_ p: UnsafeRawBufferPointer) -> PeekedFrame? {
        let n = p.count
        // The magic, "bplist00", as its 8 bytes load.
        guard n >= 8 + 1 + 32, p.loadUnaligned(as: UInt64.self) == UInt64(littleEndian: 0x3030_7473_696C_7062) else { return nil }
        // Trailer: 6 unused bytes, the offset and reference widths, object count, top object, table offset.
        let trailer = n - 32
        let offsetSize = Int(p[trailer + 6]), refSize = Int(p[trailer + 7])
        guard (1...8).contains(offsetSize), (1...8).contains(refSize) else { return nil }
        let objects = bigEndian(p, trailer + 8, 8), top = bigEndian(p, trailer + 16, 8), table = bigEndian(p, trailer + 24, 8)
        guard objects > 0, objects < n, top < objects, table >= 8, table <= trailer,
            objects <= (trailer - table) / offsetSize
        else { return nil }
        func offset(_ index: Int) -> Int? {
            guard index >= 0, index < objects else { return nil }
            let at = bigEndian(p, table + index * offsetSize, offsetSize)
            return at >= 8 && at < table ? at : nil
        }
        func reference(_ at: Int) -> Int { bigEndian(p, at, refSize) }
        /// The count of the object at `at` (its marker's low nibble, or the integer object after the marker) and
        /// where what it counts starts; nil past the objects, or for a negative count.
        func counted(_ at: Int) -> (count: Int, start: Int)? {
            let low = Int(p[at] & 0x0F)
            guard low == 0x0F else { return (low, at + 1) }
            guard at + 2 < table, p[at + 1] & 0xF0 == 0x10, p[at + 1] & 0x0F <= 3 else { return nil }
            let width = 1 << Int(p[at + 1] & 0x0F)
            guard at + 2 + width <= table else { return nil }
            let count = bigEndian(p, at + 2, width)
            return count >= 0 ? (count, at + 2 + width) : nil
        }
        /// The bytes of the ASCII string object at `at`.
        func ascii(_ at: Int) -> UnsafeRawBufferPointer? {
            guard p[at] & 0xF0 == 0x50, let (length, start) = counted(at), length <= table - start else { return nil }
            return UnsafeRawBufferPointer(rebasing: p[start..<start + length])
        }
        guard let dictionary = offset(top), p[dictionary] & 0xF0 == 0xD0, let (count, refs) = counted(dictionary),
            count <= (table - refs) / (2 * refSize)
        else { return nil }
        var type: MessageType?, id: RequestID?, seq: Int64?
        for i in 0..<count {
            guard let keyAt = offset(reference(refs + i * refSize)), let key = ascii(keyAt),
                let valueAt = offset(reference(refs + (count + i) * refSize))
            else { return nil }
            if spells(key, "type") {
                guard let name = ascii(valueAt) else { return nil }
                type = MessageType(ascii: name)
            } else if spells(key, "id") {
                guard let text = ascii(valueAt), let parsed = RequestID(uuidBytes: text) else { return nil }
                id = parsed
            } else if spells(key, "seq") {
                let marker = p[valueAt]
                guard marker & 0xF0 == 0x10, marker & 0x0F <= 3 else { return nil }
                let width = 1 << Int(marker & 0x0F)
                guard valueAt + 1 + width <= table else { return nil }
                seq = Int64(truncatingIfNeeded: bigEndian(p, valueAt + 1, width))
            } else if spells(key, "fds") {
                return nil
            }
        }
        return type.map { PeekedFrame(type: $0, id: id, seq: seq) }
    }

    @inline(__always)
    private static func spells(_ bytes: UnsafeRawBufferPointer, _ name: StaticString) -> Bool {
        guard bytes.count == name.utf8CodeUnitCount else { return false }
        for i in 0..<bytes.count where bytes[i] != name.utf8Start[i] { return false }
        return true
    }

    @inline(__always)
    private static func bigEndian(_ p: UnsafeRawBufferPointer, _ at: Int, _ size: Int) -> Int {
        var v = 0
        for i in 0..<size { v = v << 8 | Int(p[at + i]) }
        return v
    }
}

/// Frames and descriptors read from a simulated peer's socket, as a runtime or the client library would take
/// them: descriptors owned from the moment they arrive, each frame's claimed with it.
struct SocketInbox {
    private var reader = FrameReader()
    private var incoming = IncomingDescriptors()
    private var buffer = [UInt8](uninitializedCount: 16384)

    /// Reads everything `socket` (non-blocking) holds, until EAGAIN. Returns whether the peer has gone (end of
    /// file, or a reset: it closed with something of ours unread). A short read does not mean the socket is
    /// empty: a read stops after the bytes that brought descriptors.
    mutating func readAll(from socket: Int32) -> Bool {
        // A simulated socket with nothing to read (no bytes, no end, no reset) is not read: most are idle at most
        // steps, and a read that finds nothing cost as much as the step's own work.
        if SimulatedKernel.isSimulated(socket), let kernel = SimulatedKernel.current, kernel.readiness(socket) & SDK_EPOLLIN == 0 {
            // A closed descriptor also reads as idle: reading it would be the descriptor bug the read reports.
            precondition(kernel.isOpen(socket), "recvmsg(\(socket)): simulated descriptor not open — a descriptor bug")
            return false
        }
        var received: [Int32] = []
        while true {
            var truncated = false
            let result = buffer.withUnsafeMutableBytes { raw in
                Result { () throws(SystemError) in try receiveNonBlocking(socket, into: raw, descriptors: &received, truncated: &truncated) }
            }
            _ = incoming.adopt(&received, truncated: truncated)
            switch result {
            case .success(.bytes(let n)):
                buffer.withUnsafeBytes { reader.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
            case .success(.endOfFile), .failure:
                return true
            case .success(.wouldBlock):
                return false
            }
        }
    }

    /// What a peer takes from a frame: its type and id or seq (`FramePeek`), or, for a frame that brings
    /// descriptors or that the peek does not read, the message decoded in full.
    enum Incoming {
        case peeked(PeekedFrame)
        case decoded(Message)
    }

    /// The next whole frame, peeked (`FramePeek`) or decoded; nil when none is buffered or one does not decode.
    /// With `skippingStatusReports`, status reports are passed over (a client never looks inside one).
    mutating func next(skippingStatusReports: Bool = false) -> Incoming? {
        while true {
            // Most pumps find nothing: no copy of the reader for them.
            guard reader.bufferedByteCount >= Frame.headerSize else { return nil }
            var ahead = reader
            guard let peeked = try? ahead.withNextPayload({ payload throws(WireError) in FramePeek.peek(payload) }) else {
                return nil  // no whole frame (a frame over the limit fails the full read below too)
            }
            guard let peeked else {
                return nextMessage(scanningBegins: true, skippingStatusReports: skippingStatusReports).map(Incoming.decoded)
            }
            reader = ahead
            incoming.claimedNone()
            if skippingStatusReports, peeked.type == .statusReport { continue }
            return .peeked(peeked)
        }
    }

    /// The next whole message read, or nil (none, or one that does not decode). With `scanningBegins`, a `begin`
    /// that brings no files comes without its items: a fake worker records the id and would throw them away.
    /// With `skippingStatusReports`, a status report is checked as a decode would check it and passed over
    /// unbuilt: a client never looks inside one, and building it cost more than the rest of what it reads.
    mutating func nextMessage(scanningBegins: Bool = false, skippingStatusReports: Bool = false) -> Message? {
        let limits = reader.limits
        while skippingStatusReports {
            var peek = reader
            let skipped = try? peek.withNextPayload { payload throws(WireError) in
                ForwardScan.isStatusReport(payload, limits: limits)
            }
            guard skipped == true else { break }
            reader = peek
        }
        return try? incoming.nextMessage(from: &reader, buildingBeginItems: !scanningBegins)
    }
}

/// The frames of the replies fake workers send again and again (a completion titled "done", a partial result, a
/// cancellation, a pong), each encoded once with a stand-in id and then copied with the request's id written over
/// it: the same bytes the encoder writes (its strings are not shared between objects, and an id is always its 36
/// ASCII bytes). Encoding each was ~2% of a schedule. A message with files, or of another shape, is encoded.
package final class ReplyTemplates {
    package init() {}

    /// A reply's shape: everything but its id (or a pong's seq, by its width in bytes).
    private enum Shape: Equatable {
        case complete(title: String?, items: Int)
        case partial(title: String?, items: Int)
        case cancelled(ExtensionError)
        case pong(width: Int)
    }
    /// A few shapes in all: looked through in order, with no hashing. `idAt`: where the id's 36 bytes (a pong's
    /// seq's) are.
    private var templates: [(shape: Shape, bytes: [UInt8], idAt: Int)] = []
    private static let standIn = RequestID(high: 0x0123_4567_89AB_CDEF, low: 0xFEDC_BA98_7654_3210)

    /// The frame of `message`, or nil when it is not of a shape kept here.
    func frame(for message: Message) -> [UInt8]? {
        let shape: Shape, id: RequestID
        switch message {
        case .complete(let requestID, let items), .partial(let requestID, let items):
            guard items.count <= 1 else { return nil }
            var title: String?
            if let item = items.first {
                guard item.fileAttachments.isEmpty, item.text == nil, item.attachments.isEmpty, item.userInfo.isEmpty
                else { return nil }
                title = item.title
            }
            if case .complete = message {
                shape = .complete(title: title, items: items.count)
            } else {
                shape = .partial(title: title, items: items.count)
            }
            id = requestID
        case .cancelled(let requestID, let error):
            shape = .cancelled(error)
            id = requestID
        case .pong(let seq):
            return pong(seq)
        default:
            return nil
        }
        var found = templates.firstIndex { $0.shape == shape }
        if found == nil {
            let standIn: Message = switch shape {
            case .complete(let title, let count): .complete(id: Self.standIn, items: count == 0 ? [] : [ExtensionItem(title: title)])
            case .partial(let title, let count): .partial(id: Self.standIn, items: count == 0 ? [] : [ExtensionItem(title: title)])
            case .cancelled(let error): .cancelled(id: Self.standIn, error: error)
            case .pong: preconditionFailure("a pong is made by pong(_:)")
            }
            var bytes: [UInt8] = []
            var encoder = BinaryPlistEncoder()
            var outgoing = OutgoingDescriptors()
            guard (try? outgoing.encode(standIn, with: &encoder, appendingTo: &bytes)) != nil else { return nil }
            let text = Array(Self.standIn.uuidString.utf8)
            guard let at = bytes.indices.first(where: { bytes[$0...].starts(with: text) }) else { return nil }
            templates.append((shape, bytes, at))
            found = templates.count - 1
        }
        let template = templates[found!]
        var bytes = template.bytes
        bytes.withUnsafeMutableBytes { id.writeUUID(into: UnsafeMutableRawBufferPointer(rebasing: $0[template.idAt..<template.idAt + 36])) }
        return bytes
    }

    /// A pong's frame: the template of its seq's width (the encoder writes the fewest bytes of 1, 2, 4 and 8 that
    /// hold a value, 8 for a negative one), with the seq written over a stand-in's.
    private func pong(_ seq: Int64) -> [UInt8]? {
        let width = seq < 0 ? 8 : seq < 1 << 8 ? 1 : seq < 1 << 16 ? 2 : seq < 1 << 32 ? 4 : 8
        // A stand-in of that width, whose integer object (marker and bytes) appears once in the frame.
        let standIn: Int64 = width == 8 ? 0x5AA5_A55A_A55A_5AA5 : Int64(0xA5A5_A5A5 >> (32 - 8 * width))
        var found = templates.firstIndex { $0.shape == .pong(width: width) }
        if found == nil {
            var bytes: [UInt8] = []
            var encoder = BinaryPlistEncoder()
            var outgoing = OutgoingDescriptors()
            guard (try? outgoing.encode(.pong(seq: standIn), with: &encoder, appendingTo: &bytes)) != nil else { return nil }
            let object = [0x10 | UInt8(width.trailingZeroBitCount)] + (0..<width).map { UInt8(truncatingIfNeeded: standIn >> (8 * ($0 ^ (width - 1)))) }
            let at = bytes.indices.filter { bytes[$0...].starts(with: object) }
            guard at.count == 1 else { return nil }
            templates.append((.pong(width: width), bytes, at[0] + 1))
            found = templates.count - 1
        }
        let template = templates[found!]
        var bytes = template.bytes
        for k in 0..<width { bytes[template.idAt + k] = UInt8(truncatingIfNeeded: seq >> (8 * (width - 1 - k))) }
        return bytes
    }
}
