// SDKWireFoundation: a bridge between PlistValue and Foundation's property-list objects, for the interop tests
// (Foundation as an independent reader and writer of bplist00). No product imports it.
import Foundation
import SDKWire

/// Converts between `PlistValue` and Foundation property lists (XML or binary, via PropertyListSerialization).
package enum PlistFoundation {
    /// A Foundation object that has no `PlistValue` equivalent, or input that is not a property list.
    package struct ConversionError: Error, CustomStringConvertible {
        package let description: String
    }

    /// Parses an XML (or any Foundation-readable) property list.
    package static func parse(_ data: Data) throws -> PlistValue {
        let object: Any
        do {
            object = try PropertyListSerialization.propertyList(from: data, options: [], format: nil)
        } catch {
            throw ConversionError(description: "input is not a property list: \(error.localizedDescription)")
        }
        return try value(from: object, path: "root")
    }

    /// Renders a property list in `format` (XML by default).
    package static func render(
        _ value: PlistValue, format: PropertyListSerialization.PropertyListFormat = .xml
    ) throws -> Data {
        try PropertyListSerialization.data(fromPropertyList: foundationObject(value), format: format, options: 0)
    }

    package static func value(from object: Any, path: String) throws -> PlistValue {
        switch object {
        case let b as Bool where type(of: object) == Bool.self: return .bool(b)
        case let s as String: return .string(s)
        case let d as Data: return .data(Array(d))
        case let d as Date: return .date(PlistDate(secondsSinceReferenceDate: d.timeIntervalSinceReferenceDate))
        case let n as NSNumber:
            switch String(cString: n.objCType) {
            case "c", "B": return .bool(n.boolValue)
            case "f", "d": return .real(n.doubleValue)
            case "Q", "L":
                guard n.uint64Value <= UInt64(Int64.max) else {
                    throw ConversionError(description: "\(path): integer \(n) does not fit in Int64")
                }
                return .integer(n.int64Value)
            default: return .integer(n.int64Value)
            }
        case let a as [Any]:
            return .array(try a.enumerated().map { try value(from: $0.element, path: "\(path)[\($0.offset)]") })
        case let d as [String: Any]:
            var out: [String: PlistValue] = [:]
            for (k, v) in d { out[k] = try value(from: v, path: "\(path).\(k)") }
            return .dictionary(out)
        default:
            throw ConversionError(description: "\(path): unsupported property-list type \(type(of: object))")
        }
    }

    package static func foundationObject(_ value: PlistValue) -> Any {
        switch value {
        case .string(let s): return s
        case .integer(let i): return NSNumber(value: i)
        case .real(let d): return NSNumber(value: d)
        case .bool(let b): return b
        case .date(let d): return Date(timeIntervalSinceReferenceDate: d.secondsSinceReferenceDate)
        case .data(let bytes): return Data(bytes)
        case .array(let a): return a.map(foundationObject)
        case .dictionary(let d): return d.mapValues(foundationObject)
        }
    }
}
