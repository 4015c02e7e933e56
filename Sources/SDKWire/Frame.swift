// Framing: a 4-byte big-endian payload length, then a bplist00 payload (shared/DESIGN.md "Wire format").
//
// FrameReader takes bytes in whatever chunks a socket delivers them and yields whole payloads. It checks a
// frame's declared length against the limit as soon as the 4 header bytes are in, and grows its buffer only
// with bytes actually received, so a peer cannot make it allocate by claiming a large frame.

/// Frame encoding helpers.
public enum Frame {
    /// Size of the length prefix.
    public static let headerSize = 4

    /// Encodes `value` as a complete frame (header and payload).
    ///
    /// - Throws: `WireError` with code `notEncodable` when the payload would exceed `limits.maxFrameBytes`.
    public static func encode(_ value: PlistValue, limits: WireLimits = .default) throws(WireError) -> [UInt8] {
        var out: [UInt8] = []
        var encoder = BinaryPlistEncoder()
        try encode(value, with: &encoder, appendingTo: &out, limits: limits)
        return out
    }

    /// Appends a frame for `value` to `out` using a caller-owned encoder (no scratch allocation when reused).
    ///
    /// - Throws: `WireError` with code `notEncodable` when the payload would exceed `limits.maxFrameBytes`;
    ///   `out` is then left as it was.
    public static func encode(
        _ value: PlistValue, with encoder: inout BinaryPlistEncoder, appendingTo out: inout [UInt8],
        limits: WireLimits = .default
    ) throws(WireError) {
        try append(to: &out, limits: limits) { encoder.encode(value, appendingTo: &$0, limit: limits.maxFrameBytes) }
    }

    /// Appends a frame whose payload `writePayload` appends to the bytes it is given: the one place a frame's
    /// length is written and checked (encoded, flat and forwarded frames). A payload writer that knows its size
    /// first may return it instead of writing a payload over the limit.
    ///
    /// - Throws: `WireError` with code `notEncodable` when the payload would exceed `limits.maxFrameBytes`;
    ///   `out` is then left as it was.
    @inline(__always)
    static func append(to out: inout [UInt8], limits: WireLimits, _ writePayload: (inout [UInt8]) -> Int?)
        throws(WireError)
    {
        let headerAt = out.count
        out.append(contentsOf: [0, 0, 0, 0])
        if let refused = writePayload(&out) {
            out.removeSubrange(headerAt...)
            throw WireError(.notEncodable, "frame payload of \(refused) bytes exceeds the limit of \(limits.maxFrameBytes)")
        }
        let length = out.count - headerAt - headerSize
        guard length <= limits.maxFrameBytes, length <= Int(UInt32.max) else {
            out.removeSubrange(headerAt...)
            throw WireError(.notEncodable, "frame payload of \(length) bytes exceeds the limit of \(limits.maxFrameBytes)")
        }
        out[headerAt] = UInt8(truncatingIfNeeded: length >> 24)
        out[headerAt + 1] = UInt8(truncatingIfNeeded: length >> 16)
        out[headerAt + 2] = UInt8(truncatingIfNeeded: length >> 8)
        out[headerAt + 3] = UInt8(truncatingIfNeeded: length)
    }
}

/// Reassembles frames from a byte stream delivered in arbitrary chunks.
///
/// After a framing error (an oversized declared length) the stream cannot be resynchronised: every later call
/// throws the same error. A payload that is framed correctly but does not decode is consumed, so the next frame
/// can still be read.
public struct FrameReader: Sendable {
    // `@usableFromInline`: `withNextPayload` is inlinable, so that a caller in another module gets it specialized
    // (unspecialized, it looked up its `Result`'s generic metadata at every frame).
    @usableFromInline var buffer: [UInt8] = []
    @usableFromInline var readIndex = 0
    @usableFromInline var failure: WireError?
    /// The limits applied to each frame.
    public let limits: WireLimits

    /// Creates a reader.
    public init(limits: WireLimits = .default) { self.limits = limits }

    /// Bytes received but not yet returned as frames.
    public var bufferedByteCount: Int { buffer.count - readIndex }

    /// Bytes of memory the buffer holds (its capacity), for memory accounting.
    public var bufferCapacity: Int { buffer.capacity }

    @usableFromInline static let retainedCapacity = 256 << 10

    /// Adds received bytes.
    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        compactIfUseful()
        buffer.append(contentsOf: bytes)
    }

    /// Adds received bytes.
    public mutating func append<S: Sequence>(contentsOf bytes: S) where S.Element == UInt8 {
        compactIfUseful()
        buffer.append(contentsOf: bytes)
    }

    /// Calls `body` with the next whole payload, if one is buffered, and consumes it.
    ///
    /// - Returns: `body`'s result, or `nil` when no whole frame is buffered yet.
    /// - Throws: `WireError(.frameTooLarge)` for a declared length over the limit; errors thrown by `body`.
    @inlinable
    public mutating func withNextPayload<R>(
        _ body: (UnsafeRawBufferPointer) throws(WireError) -> R
    ) throws(WireError) -> R? {
        if let failure { throw failure }
        let available = buffer.count - readIndex
        guard available >= Frame.headerSize else { return nil }
        let length = buffer.withUnsafeBufferPointer { b in
            Int(b[readIndex]) << 24 | Int(b[readIndex + 1]) << 16 | Int(b[readIndex + 2]) << 8 | Int(b[readIndex + 3])
        }
        guard length <= limits.maxFrameBytes else {
            let error = WireError(
                .frameTooLarge, "frame declares \(length) bytes; the limit is \(limits.maxFrameBytes)")
            failure = error
            throw error
        }
        guard available - Frame.headerSize >= length else { return nil }
        let start = readIndex + Frame.headerSize
        readIndex = start + length
        let result = buffer.withUnsafeBytes { raw in
            Result { () throws(WireError) in try body(UnsafeRawBufferPointer(rebasing: raw[start..<start + length])) }
        }
        if readIndex == buffer.count, buffer.capacity > Self.retainedCapacity {
            buffer = []
            readIndex = 0
        }
        return try result.get()
    }

    /// The next whole frame decoded, or `nil` when none is buffered.
    ///
    /// - Throws: `WireError` for an oversized frame or an undecodable payload (the payload is consumed).
    public mutating func nextValue() throws(WireError) -> PlistValue? {
        let limits = self.limits
        return try withNextPayload { payload throws(WireError) in
            try BinaryPlistDecoder.decode(payload, limits: limits)
        }
    }

    /// Drops consumed bytes once they are the larger part of the buffer, keeping appends amortised O(1). A
    /// buffer grown for a large frame is released once empty, so an idle connection holds no more than 256 KiB.
    private mutating func compactIfUseful() {
        if readIndex == buffer.count {
            buffer.removeAll(keepingCapacity: buffer.capacity <= Self.retainedCapacity)
            readIndex = 0
        } else if readIndex > 4096, readIndex * 2 > buffer.count {
            buffer.removeSubrange(0..<readIndex)
            readIndex = 0
        }
    }
}
