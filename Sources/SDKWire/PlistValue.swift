// PlistValue: the value model of the wire format (shared/DESIGN.md "Wire format").
// A plain enum with literals and accessors; it has no Foundation dependency so that workers and the
// codec stay on the stdlib.

/// A point in time, stored as property lists store it: seconds since 2001-01-01 00:00:00 UTC.
public struct PlistDate: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// Seconds since 2001-01-01 00:00:00 UTC (the Core Foundation reference date).
    public var secondsSinceReferenceDate: Double

    /// Seconds between 1970-01-01 and 2001-01-01.
    public static let unixEpochOffset: Double = 978_307_200

    /// Creates a date from seconds since the 2001 reference date.
    public init(secondsSinceReferenceDate: Double) { self.secondsSinceReferenceDate = secondsSinceReferenceDate }

    /// Creates a date from seconds since the Unix epoch.
    public init(secondsSince1970: Double) { self.secondsSinceReferenceDate = secondsSince1970 - Self.unixEpochOffset }

    /// Seconds since the Unix epoch.
    public var secondsSince1970: Double { secondsSinceReferenceDate + Self.unixEpochOffset }

    public static func < (a: PlistDate, b: PlistDate) -> Bool { a.secondsSinceReferenceDate < b.secondsSinceReferenceDate }

    public var description: String { "PlistDate(\(secondsSinceReferenceDate))" }
}

/// A property-list value: the unit of everything sdk-host sends over the wire.
///
/// Reals compare equal when both are NaN, so that a decoded value always equals the value that was encoded.
public enum PlistValue: Sendable {
    /// A string (ASCII or UTF-16 on the wire).
    case string(String)
    /// A 64-bit signed integer.
    case integer(Int64)
    /// A double-precision real.
    case real(Double)
    /// A boolean.
    case bool(Bool)
    /// A date.
    case date(PlistDate)
    /// Raw bytes.
    case data([UInt8])
    /// An ordered list of values.
    case array([PlistValue])
    /// Values by string key.
    case dictionary([String: PlistValue])
}

extension PlistValue: Equatable {
    public static func == (lhs: PlistValue, rhs: PlistValue) -> Bool {
        switch (lhs, rhs) {
        case let (.string(a), .string(b)): return a == b
        case let (.integer(a), .integer(b)): return a == b
        case let (.real(a), .real(b)): return a == b || (a.isNaN && b.isNaN)
        case let (.bool(a), .bool(b)): return a == b
        case let (.date(a), .date(b)):
            return a == b || (a.secondsSinceReferenceDate.isNaN && b.secondsSinceReferenceDate.isNaN)
        case let (.data(a), .data(b)): return a == b
        case let (.array(a), .array(b)): return a == b
        case let (.dictionary(a), .dictionary(b)): return a == b
        default: return false
        }
    }
}

// MARK: - Accessors

extension PlistValue {
    /// The string, if this is a string.
    public var stringValue: String? { if case .string(let v) = self { v } else { nil } }
    /// The integer, if this is an integer.
    public var integerValue: Int64? { if case .integer(let v) = self { v } else { nil } }
    /// The integer as `Int`, if this is an integer.
    public var intValue: Int? { if case .integer(let v) = self { Int(exactly: v) } else { nil } }
    /// The real; integers are widened, since plist writers differ on which they emit for whole numbers.
    public var doubleValue: Double? {
        switch self {
        case .real(let v): v
        case .integer(let v): Double(v)
        default: nil
        }
    }
    /// The boolean, if this is a boolean.
    public var boolValue: Bool? { if case .bool(let v) = self { v } else { nil } }
    /// The date, if this is a date.
    public var dateValue: PlistDate? { if case .date(let v) = self { v } else { nil } }
    /// The bytes, if this is data.
    public var dataValue: [UInt8]? { if case .data(let v) = self { v } else { nil } }
    /// The elements, if this is an array.
    public var arrayValue: [PlistValue]? { if case .array(let v) = self { v } else { nil } }
    /// The entries, if this is a dictionary.
    public var dictionaryValue: [String: PlistValue]? { if case .dictionary(let v) = self { v } else { nil } }

    /// The value for `key` when this is a dictionary; `nil` otherwise.
    public subscript(key: String) -> PlistValue? {
        if case .dictionary(let d) = self { d[key] } else { nil }
    }

    /// The element at `index` when this is an array and the index is in range; `nil` otherwise.
    public subscript(index: Int) -> PlistValue? {
        if case .array(let a) = self, a.indices.contains(index) { a[index] } else { nil }
    }

    /// A short name of the case, for error messages ("string", "dictionary", ...).
    public var kindName: String {
        switch self {
        case .string: "string"
        case .integer: "integer"
        case .real: "real"
        case .bool: "bool"
        case .date: "date"
        case .data: "data"
        case .array: "array"
        case .dictionary: "dictionary"
        }
    }
}

// MARK: - Literals

extension PlistValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .integer(value) }
    public init(floatLiteral value: Double) { self = .real(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(arrayLiteral elements: PlistValue...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, PlistValue)...) {
        self = .dictionary(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }
}

extension PlistValue: CustomStringConvertible {
    /// A compact, JSON-like rendering for logs and the CLI.
    public var description: String {
        var out = ""
        Self.render(self, into: &out)
        return out
    }

    private static func render(_ value: PlistValue, into out: inout String) {
        switch value {
        case .string(let s): out += "\"\(s)\""
        case .integer(let i): out += String(i)
        case .real(let d): out += String(d)
        case .bool(let b): out += b ? "true" : "false"
        case .date(let d): out += "@\(d.secondsSinceReferenceDate)"
        case .data(let bytes): out += "<\(bytes.count) bytes>"
        case .array(let a):
            out += "["
            for (i, e) in a.enumerated() {
                if i > 0 { out += ", " }
                render(e, into: &out)
            }
            out += "]"
        case .dictionary(let d):
            out += "{"
            for (i, key) in d.keys.sorted().enumerated() {
                if i > 0 { out += ", " }
                out += "\"\(key)\": "
                render(d[key]!, into: &out)
            }
            out += "}"
        }
    }
}
