// PlistValueEncoder and PlistValueDecoder: Codable values to and from PlistValue, so that typed requests and
// responses travel as items (shared/DESIGN.md "Typed payloads"). No Foundation: workers stay on the stdlib.
//
// Mapping: Bool -> bool; integers -> integer (a UInt64 above Int64.max is an error); Float and Double -> real;
// String -> string; PlistDate -> date; PlistValue -> itself; keyed containers -> dictionary; unkeyed -> array.
// Property lists have no null: a nil optional is left out of its dictionary; nil in an array is an error.
// The decoder reads integers and reals interchangeably where the value fits exactly.

/// Encodes `Encodable` values as `PlistValue`.
public struct PlistValueEncoder: Sendable {
    /// Creates an encoder.
    public init() {}

    /// The property-list form of `value`.
    ///
    /// - Throws: `EncodingError.invalidValue` for a value a property list cannot hold (nil in an array, a top-level
    ///   nil, an integer above Int64.max).
    public func encode<T: Encodable>(_ value: T) throws -> PlistValue {
        try PlistEncoding.box(value, at: nil)
    }
}

/// Decodes `Decodable` values from `PlistValue`.
public struct PlistValueDecoder: Sendable {
    /// Creates a decoder.
    public init() {}

    /// A `T` read from `plist`.
    ///
    /// - Throws: `DecodingError` naming the coding path of a missing key or a value of the wrong kind.
    public func decode<T: Decodable>(_ type: T.Type, from plist: PlistValue) throws -> T {
        try PlistDecoding(plist, at: []).unbox(type)
    }
}

// MARK: - Encoding
//
// The daemon encodes its status (some hundred values) for every `status` a client asks: the leaves (numbers,
// strings, booleans) go straight in as values, without a container, a dynamic cast per primitive type or a
// coding path of their own; a coding path is built only when something asks for it (an error, or an
// `encode(to:)` that reads it).

/// A coding path as a chain from a value up to the root: a level costs one link, not a copy of the path.
private final class PathLink {
    let key: any CodingKey
    let parent: PathLink?
    init(_ key: any CodingKey, _ parent: PathLink?) {
        self.key = key
        self.parent = parent
    }

    var keys: [any CodingKey] { Optional(self).keys }
}

extension Optional where Wrapped == PathLink {
    /// The path from the root.
    fileprivate var keys: [any CodingKey] {
        var out: [any CodingKey] = []
        var link = self
        while let l = link {
            out.append(l.key)
            link = l.parent
        }
        return out.reversed()
    }

    fileprivate func appending(_ key: any CodingKey) -> PathLink { PathLink(key, self) }
}

/// A container under construction. Classes, so that nested containers handed out earlier can still be filled.
private final class Node {
    /// What a container holds: a finished value, or a container that may still be filled.
    enum Child {
        case value(PlistValue)
        case node(Node)

        func materialize() -> PlistValue {
            switch self {
            case .value(let v): v
            case .node(let n): n.materialize()
            }
        }
    }
    enum Content { case empty, value(PlistValue), dictionary([String: Child]), array([Child]) }
    var content: Content = .empty

    func materialize() -> PlistValue {
        switch content {
        case .empty: return .dictionary([:])  // an encode(to:) that wrote nothing: an empty object
        case .value(let v): return v
        case .dictionary(let d): return .dictionary(d.mapValues { $0.materialize() })
        case .array(let a): return .array(a.map { $0.materialize() })
        }
    }

    func set(_ key: String, _ child: Child) {
        guard case .dictionary(var d) = content else { return }
        content = .empty  // keep `d` uniquely referenced while it is changed
        d[key] = child
        content = .dictionary(d)
    }

    func append(_ child: Child) {
        guard case .array(var a) = content else { return }
        content = .empty
        a.append(child)
        content = .array(a)
    }
}

/// Values with a property-list form of their own.
private protocol PlistPrimitive {
    func plistValue(at path: @autoclosure () -> [any CodingKey]) throws -> PlistValue
}

extension PlistValue: PlistPrimitive {
    fileprivate func plistValue(at path: @autoclosure () -> [any CodingKey]) -> PlistValue { self }
}
extension PlistDate: PlistPrimitive {
    fileprivate func plistValue(at path: @autoclosure () -> [any CodingKey]) -> PlistValue { .date(self) }
}
extension String: PlistPrimitive {
    fileprivate func plistValue(at path: @autoclosure () -> [any CodingKey]) -> PlistValue { .string(self) }
}
extension Bool: PlistPrimitive {
    fileprivate func plistValue(at path: @autoclosure () -> [any CodingKey]) -> PlistValue { .bool(self) }
}
extension Double: PlistPrimitive {
    fileprivate func plistValue(at path: @autoclosure () -> [any CodingKey]) -> PlistValue { .real(self) }
}
extension Float: PlistPrimitive {
    fileprivate func plistValue(at path: @autoclosure () -> [any CodingKey]) -> PlistValue { .real(Double(self)) }
}
extension Int: PlistPrimitive {}
extension Int8: PlistPrimitive {}
extension Int16: PlistPrimitive {}
extension Int32: PlistPrimitive {}
extension Int64: PlistPrimitive {}
extension UInt: PlistPrimitive {}
extension UInt8: PlistPrimitive {}
extension UInt16: PlistPrimitive {}
extension UInt32: PlistPrimitive {}
extension UInt64: PlistPrimitive {}

extension PlistPrimitive where Self: FixedWidthInteger {
    /// An integer, if it fits a property list's (Int64): a UInt64 above Int64.max does not.
    fileprivate func plistValue(at path: @autoclosure () -> [any CodingKey]) throws -> PlistValue {
        guard let i = Int64(exactly: self) else {
            // As a UInt64, whatever its width (what the error carried before).
            throw EncodingError.invalidValue(UInt64(self), .init(codingPath: path(), debugDescription: "\(self) does not fit a property-list integer (Int64)"))
        }
        return .integer(i)
    }
}

private enum PlistEncoding {
    static func box<T: Encodable>(_ value: T, at path: PathLink?) throws -> PlistValue {
        if let primitive = value as? any PlistPrimitive { return try primitive.plistValue(at: path.keys) }
        let node = Node()
        try value.encode(to: NodeEncoder(node: node, path: path))
        return node.materialize()
    }
}

private struct NodeEncoder: Encoder {
    let node: Node
    let path: PathLink?
    var codingPath: [any CodingKey] { path.keys }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        if case .dictionary = node.content {} else { node.content = .dictionary([:]) }
        return KeyedEncodingContainer(KeyedNodeContainer<Key>(node: node, path: path))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        if case .array = node.content {} else { node.content = .array([]) }
        return UnkeyedNodeContainer(node: node, path: path)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer { SingleNodeContainer(node: node, path: path) }
}

private struct KeyedNodeContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let node: Node
    let path: PathLink?
    var codingPath: [any CodingKey] { path.keys }

    mutating func encodeNil(forKey key: Key) throws {}  // property lists have no null: the key is left out

    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        node.set(key.stringValue, .value(try PlistEncoding.box(value, at: path.appending(key))))
    }

    // The leaves, without a box of their own.
    private func leaf(_ value: some PlistPrimitive, _ key: Key) throws {
        node.set(key.stringValue, .value(try value.plistValue(at: path.appending(key).keys)))
    }
    mutating func encode(_ value: Bool, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: String, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: Double, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: Float, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: Int, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: Int8, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: Int16, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: Int32, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: Int64, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: UInt, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { try leaf(value, key) }
    mutating func encode(_ value: UInt64, forKey key: Key) throws { try leaf(value, key) }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        let child = Node()
        node.set(key.stringValue, .node(child))
        return NodeEncoder(node: child, path: path.appending(key)).container(keyedBy: keyType)
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        let child = Node()
        node.set(key.stringValue, .node(child))
        return NodeEncoder(node: child, path: path.appending(key)).unkeyedContainer()
    }

    mutating func superEncoder() -> any Encoder { superEncoder(forKey: Key(stringValue: "super")!) }

    mutating func superEncoder(forKey key: Key) -> any Encoder {
        let child = Node()
        node.set(key.stringValue, .node(child))
        return NodeEncoder(node: child, path: path.appending(key))
    }
}

private struct IndexKey: CodingKey {
    let intValue: Int?
    let stringValue: String
    init(_ index: Int) { intValue = index; stringValue = "Index \(index)" }
    init?(intValue: Int) { self.init(intValue) }
    init?(stringValue: String) { return nil }
}

private struct UnkeyedNodeContainer: UnkeyedEncodingContainer {
    let node: Node
    let path: PathLink?
    var codingPath: [any CodingKey] { path.keys }
    var count: Int { if case .array(let a) = node.content { a.count } else { 0 } }

    mutating func encodeNil() throws {
        throw EncodingError.invalidValue(
            Optional<Int>.none as Any,
            .init(codingPath: path.appending(IndexKey(count)).keys, debugDescription: "a property-list array cannot hold nil"))
    }

    mutating func encode<T: Encodable>(_ value: T) throws {
        node.append(.value(try PlistEncoding.box(value, at: path.appending(IndexKey(count)))))
    }

    // The leaves, without a box of their own.
    private func leaf(_ value: some PlistPrimitive) throws {
        node.append(.value(try value.plistValue(at: path.appending(IndexKey(count)).keys)))
    }
    mutating func encode(_ value: Bool) throws { try leaf(value) }
    mutating func encode(_ value: String) throws { try leaf(value) }
    mutating func encode(_ value: Double) throws { try leaf(value) }
    mutating func encode(_ value: Float) throws { try leaf(value) }
    mutating func encode(_ value: Int) throws { try leaf(value) }
    mutating func encode(_ value: Int8) throws { try leaf(value) }
    mutating func encode(_ value: Int16) throws { try leaf(value) }
    mutating func encode(_ value: Int32) throws { try leaf(value) }
    mutating func encode(_ value: Int64) throws { try leaf(value) }
    mutating func encode(_ value: UInt) throws { try leaf(value) }
    mutating func encode(_ value: UInt8) throws { try leaf(value) }
    mutating func encode(_ value: UInt16) throws { try leaf(value) }
    mutating func encode(_ value: UInt32) throws { try leaf(value) }
    mutating func encode(_ value: UInt64) throws { try leaf(value) }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        let child = Node()
        let link = path.appending(IndexKey(count))
        node.append(.node(child))
        return NodeEncoder(node: child, path: link).container(keyedBy: keyType)
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let child = Node()
        let link = path.appending(IndexKey(count))
        node.append(.node(child))
        return NodeEncoder(node: child, path: link).unkeyedContainer()
    }

    mutating func superEncoder() -> any Encoder {
        let child = Node()
        let link = path.appending(IndexKey(count))
        node.append(.node(child))
        return NodeEncoder(node: child, path: link)
    }
}

private struct SingleNodeContainer: SingleValueEncodingContainer {
    let node: Node
    let path: PathLink?
    var codingPath: [any CodingKey] { path.keys }

    mutating func encodeNil() throws {
        throw EncodingError.invalidValue(
            Optional<Int>.none as Any, .init(codingPath: codingPath, debugDescription: "a property list cannot hold nil"))
    }

    mutating func encode<T: Encodable>(_ value: T) throws {
        node.content = .value(try PlistEncoding.box(value, at: path))
    }
}

// MARK: - Decoding

private struct PlistDecoding: Decoder {
    let value: PlistValue
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    init(_ value: PlistValue, at path: [any CodingKey]) {
        self.value = value
        codingPath = path
    }

    func mismatch(_ expected: String) -> DecodingError {
        .typeMismatch(Any.self, .init(codingPath: codingPath, debugDescription: "expected \(expected), found \(value.kindName)"))
    }

    func unbox<T: Decodable>(_ type: T.Type) throws -> T {
        if let direct = try primitive(type) { return direct }
        return try T(from: self)
    }

    func primitive<T>(_ type: T.Type) throws -> T? {
        func integer<I: FixedWidthInteger>(_: I.Type) throws -> I {
            if case .integer(let v) = value, let i = I(exactly: v) { return i }
            if case .real(let d) = value, let i = I(exactly: d) { return i }
            throw mismatch("an integer that fits \(I.self)")
        }
        switch type {
        case is PlistValue.Type: return value as? T
        case is PlistDate.Type:
            guard case .date(let d) = value else { throw mismatch("a date") }
            return d as? T
        case is String.Type:
            guard case .string(let s) = value else { throw mismatch("a string") }
            return s as? T
        case is Bool.Type:
            guard case .bool(let b) = value else { throw mismatch("a boolean") }
            return b as? T
        case is Double.Type:
            guard let d = value.doubleValue else { throw mismatch("a number") }
            return d as? T
        case is Float.Type:
            guard let d = value.doubleValue else { throw mismatch("a number") }
            return Float(d) as? T
        case is Int.Type: return try integer(Int.self) as? T
        case is Int8.Type: return try integer(Int8.self) as? T
        case is Int16.Type: return try integer(Int16.self) as? T
        case is Int32.Type: return try integer(Int32.self) as? T
        case is Int64.Type: return try integer(Int64.self) as? T
        case is UInt.Type: return try integer(UInt.self) as? T
        case is UInt8.Type: return try integer(UInt8.self) as? T
        case is UInt16.Type: return try integer(UInt16.self) as? T
        case is UInt32.Type: return try integer(UInt32.self) as? T
        case is UInt64.Type: return try integer(UInt64.self) as? T
        default: return nil
        }
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard case .dictionary(let d) = value else { throw mismatch("a dictionary") }
        return KeyedDecodingContainer(KeyedPlistContainer<Key>(entries: d, codingPath: codingPath))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard case .array(let a) = value else { throw mismatch("an array") }
        return UnkeyedPlistContainer(elements: a, codingPath: codingPath)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer { SinglePlistContainer(decoder: self) }
}

private struct KeyedPlistContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let entries: [String: PlistValue]
    let codingPath: [any CodingKey]
    var allKeys: [Key] { entries.keys.compactMap { Key(stringValue: $0) } }

    func contains(_ key: Key) -> Bool { entries[key.stringValue] != nil }

    func child(_ key: Key) throws -> PlistDecoding {
        guard let v = entries[key.stringValue] else {
            throw DecodingError.keyNotFound(key, .init(codingPath: codingPath, debugDescription: "no value for key '\(key.stringValue)'"))
        }
        return PlistDecoding(v, at: codingPath + [key])
    }

    func decodeNil(forKey key: Key) throws -> Bool { entries[key.stringValue] == nil }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T { try child(key).unbox(type) }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        try child(key).container(keyedBy: type)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer { try child(key).unkeyedContainer() }

    func superDecoder() throws -> any Decoder { try child(Key(stringValue: "super")!) }

    func superDecoder(forKey key: Key) throws -> any Decoder { try child(key) }
}

private struct UnkeyedPlistContainer: UnkeyedDecodingContainer {
    let elements: [PlistValue]
    let codingPath: [any CodingKey]
    var currentIndex = 0
    var count: Int? { elements.count }
    var isAtEnd: Bool { currentIndex >= elements.count }

    init(elements: [PlistValue], codingPath: [any CodingKey]) {
        self.elements = elements
        self.codingPath = codingPath
    }

    mutating func next() throws -> PlistDecoding {
        guard !isAtEnd else {
            throw DecodingError.valueNotFound(Any.self, .init(codingPath: codingPath + [IndexKey(currentIndex)], debugDescription: "the array has only \(elements.count) element(s)"))
        }
        defer { currentIndex += 1 }
        return PlistDecoding(elements[currentIndex], at: codingPath + [IndexKey(currentIndex)])
    }

    mutating func decodeNil() throws -> Bool { false }  // arrays hold no nil

    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T { try next().unbox(type) }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        try next().container(keyedBy: type)
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer { try next().unkeyedContainer() }

    mutating func superDecoder() throws -> any Decoder { try next() }
}

private struct SinglePlistContainer: SingleValueDecodingContainer {
    let decoder: PlistDecoding
    var codingPath: [any CodingKey] { decoder.codingPath }

    func decodeNil() -> Bool { false }

    func decode<T: Decodable>(_ type: T.Type) throws -> T { try decoder.unbox(type) }
}

// MARK: - The wire model itself as Codable

/// Any string, as a coding key (for PlistValue dictionaries under other encoders).
private struct AnyKey: CodingKey {
    let stringValue: String
    var intValue: Int? { nil }
    init(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { return nil }
}

extension PlistDate: Codable {
    /// Under `PlistValueEncoder` a date; under other encoders its seconds since the 2001 reference date.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(secondsSinceReferenceDate)
    }

    public init(from decoder: any Decoder) throws {
        self.init(secondsSinceReferenceDate: try decoder.singleValueContainer().decode(Double.self))
    }
}

extension PlistValue: Codable {
    /// Under `PlistValueEncoder` the value itself; under other encoders (JSON, say) its natural form, with data as
    /// an array of bytes and dates as seconds since 2001.
    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .string(let v): var c = encoder.singleValueContainer(); try c.encode(v)
        case .integer(let v): var c = encoder.singleValueContainer(); try c.encode(v)
        case .real(let v): var c = encoder.singleValueContainer(); try c.encode(v)
        case .bool(let v): var c = encoder.singleValueContainer(); try c.encode(v)
        case .date(let v): var c = encoder.singleValueContainer(); try c.encode(v)
        case .data(let v): var c = encoder.singleValueContainer(); try c.encode(v)
        case .array(let a):
            var c = encoder.unkeyedContainer()
            for element in a { try c.encode(element) }
        case .dictionary(let d):
            var c = encoder.container(keyedBy: AnyKey.self)
            for (key, element) in d { try c.encode(element, forKey: AnyKey(stringValue: key)) }
        }
    }

    public init(from decoder: any Decoder) throws {
        if let direct = decoder as? PlistDecoding {
            self = direct.value
            return
        }
        if let keyed = try? decoder.container(keyedBy: AnyKey.self) {
            var d: [String: PlistValue] = [:]
            for key in keyed.allKeys { d[key.stringValue] = try keyed.decode(PlistValue.self, forKey: key) }
            self = .dictionary(d)
        } else if var unkeyed = try? decoder.unkeyedContainer() {
            var a: [PlistValue] = []
            while !unkeyed.isAtEnd { a.append(try unkeyed.decode(PlistValue.self)) }
            self = .array(a)
        } else {
            let c = try decoder.singleValueContainer()
            if let v = try? c.decode(Bool.self) { self = .bool(v) }
            else if let v = try? c.decode(Int64.self) { self = .integer(v) }
            else if let v = try? c.decode(Double.self) { self = .real(v) }
            else { self = .string(try c.decode(String.self)) }
        }
    }
}
