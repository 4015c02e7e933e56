// WireError and WireLimits: what the codec and frame reader report, and the bounds they enforce on
// untrusted input. Every failure is a typed error with a code and a detail naming where it happened.

/// An error from decoding or framing wire data. Decoding untrusted bytes reports one of these; it never traps.
public struct WireError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What went wrong, independent of where.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Raw: String, Hashable, Sendable {
            case badMagic, truncated, badTrailer, offsetOutOfRange, objectRefOutOfRange, cycle, tooDeep,
                tooManyObjects, frameTooLarge, unsupportedObject, invalidObject, integerOutOfRange,
                invalidKey, notEncodable
        }
        private let raw: Raw
        private init(_ raw: Raw) { self.raw = raw }

        /// The payload does not start with `bplist00`.
        public static let badMagic = Code(.badMagic)
        /// Fewer bytes than the header and trailer need.
        public static let truncated = Code(.truncated)
        /// The 32-byte trailer holds sizes or counts that do not fit the payload.
        public static let badTrailer = Code(.badTrailer)
        /// An object offset or an object's extent falls outside the object area.
        public static let offsetOutOfRange = Code(.offsetOutOfRange)
        /// A container refers to an object index past the object count.
        public static let objectRefOutOfRange = Code(.objectRefOutOfRange)
        /// A container contains itself, directly or indirectly.
        public static let cycle = Code(.cycle)
        /// Containers nest deeper than the configured limit.
        public static let tooDeep = Code(.tooDeep)
        /// The object count (or the number of values that shared objects expand to) exceeds the limit.
        public static let tooManyObjects = Code(.tooManyObjects)
        /// A frame's declared length exceeds the configured limit.
        public static let frameTooLarge = Code(.frameTooLarge)
        /// A valid bplist object type that sdk-host does not carry (null, UID, set, fill).
        public static let unsupportedObject = Code(.unsupportedObject)
        /// An object whose marker or contents are malformed (bad size nibble, non-ASCII in an ASCII string).
        public static let invalidObject = Code(.invalidObject)
        /// An integer that does not fit in 64-bit signed.
        public static let integerOutOfRange = Code(.integerOutOfRange)
        /// A dictionary key that is not a string.
        public static let invalidKey = Code(.invalidKey)
        /// A value the encoder refuses (a frame that would exceed the limit).
        public static let notEncodable = Code(.notEncodable)

        public var description: String { raw.rawValue }
    }

    /// What went wrong.
    public let code: Code
    /// Where and with what values: an offset, an object index, a limit.
    public let detail: String

    /// Creates an error with a code and a detail.
    public init(_ code: Code, _ detail: String) {
        self.code = code
        self.detail = detail
    }

    public var description: String { "\(code): \(detail)" }
}

/// Bounds applied to untrusted wire data before anything is allocated in proportion to it.
public struct WireLimits: Hashable, Sendable {
    /// The largest accepted frame payload in bytes. Default 16 MiB.
    public var maxFrameBytes: Int
    /// The deepest accepted container nesting. Default 512; clamped to 1...4096 to bound stack use.
    public var maxDepth: Int {
        get { _maxDepth }
        set { _maxDepth = min(max(newValue, 1), 4096) }
    }
    /// The most objects a payload may declare, and the most values it may expand to through shared objects.
    public var maxObjects: Int
    /// The most bytes one payload may decode to, whatever its size (each value is charged what it holds on the
    /// heap: its slot, its bytes, and the storage a string, data, array, dictionary or message item makes).
    /// Default 128 MiB: a 16 MiB frame of small items builds up to ~8 times its size as a tree (our encoder's;
    /// ~15 times a Python runtime's, which shares strings).
    public var maxDecodedBytes: Int
    /// How many times its own size a payload may decode to (plus 64 KiB), so that shared references cannot
    /// make a small frame expand. Default 64: a runtime that shares a container between items (Python's, by
    /// identity) makes messages charged ~50 times their size.
    public var maxExpansion: Int

    private var _maxDepth: Int

    /// Creates limits; the defaults are those of shared/DESIGN.md.
    public init(maxFrameBytes: Int = 16 << 20, maxDepth: Int = 512, maxObjects: Int = 4 << 20,
                maxDecodedBytes: Int = 128 << 20, maxExpansion: Int = 64)
    {
        self.maxFrameBytes = maxFrameBytes
        self._maxDepth = min(max(maxDepth, 1), 4096)
        self.maxObjects = maxObjects
        self.maxDecodedBytes = maxDecodedBytes
        self.maxExpansion = maxExpansion
    }

    /// The byte budget for decoding a payload of `payloadBytes`: proportional to it, never above
    /// `maxDecodedBytes`.
    public func decodedBytesBudget(payloadBytes: Int) -> Int {
        let (scaled, overflow) = payloadBytes.multipliedReportingOverflow(by: max(maxExpansion, 1))
        return min(overflow ? Int.max : scaled &+ 64 << 10, maxDecodedBytes)
    }

    /// The defaults: 16 MiB frames, depth 512, 4 Mi objects.
    public static let `default` = WireLimits()
}

extension WireError {
    /// Why a request's begin was not sent (the embedded host's and the daemon client's words for it): nested past
    /// the limit is not "too large", and is said as what it is.
    package var requestNotSent: String {
        (code == .tooDeep ? "request cannot be encoded: " : "request too large to send: ") + detail
    }
}
