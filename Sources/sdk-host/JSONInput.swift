// `request --payload JSON`: a JSON text read into the property-list value an extension decodes with
// `ExtensionItem.decode` (what `ExtensionItem(encoding:)` sends). Objects become dictionaries, arrays arrays,
// strings strings, whole numbers integers, other numbers reals, true and false booleans; null has no property-list
// form and is an error, as is anything after the value. Errors say what and at which byte.
import SDKHost

enum JSONInput {
    struct Failure: Error, CustomStringConvertible {
        let offset: Int
        let what: String
        var description: String { "\(what) at byte \(offset)" }
    }

    static func parse(_ text: String) throws(Failure) -> PlistValue {
        var reader = Reader(bytes: Array(text.utf8))
        let value = try reader.value(depth: 0)
        reader.skipSpace()
        guard reader.at == reader.bytes.count else { throw Failure(offset: reader.at, what: "unexpected text after the value") }
        return value
    }

    struct Reader {
        let bytes: [UInt8]
        var at = 0

        mutating func skipSpace() {
            while at < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[at]) { at += 1 }
        }

        func fail(_ what: String) -> Failure { Failure(offset: at, what: what) }

        mutating func expect(_ word: String) throws(Failure) {
            let w = Array(word.utf8)
            guard at + w.count <= bytes.count, Array(bytes[at..<at + w.count]) == w else { throw fail("expected '\(word)'") }
            at += w.count
        }

        mutating func value(depth: Int) throws(Failure) -> PlistValue {
            // A request's frame nests at most 512 levels, its own four around the payload included.
            guard depth < 500 else { throw fail("nested deeper than 500 levels") }
            skipSpace()
            guard at < bytes.count else { throw fail("a value is missing") }
            switch bytes[at] {
            case UInt8(ascii: "{"):
                at += 1
                var fields: [String: PlistValue] = [:]
                skipSpace()
                if at < bytes.count, bytes[at] == UInt8(ascii: "}") { at += 1; return .dictionary(fields) }
                while true {
                    skipSpace()
                    guard at < bytes.count, bytes[at] == UInt8(ascii: "\"") else { throw fail("expected a key in quotes") }
                    let key = try string()
                    skipSpace()
                    try expect(":")
                    fields[key] = try value(depth: depth + 1)
                    skipSpace()
                    guard at < bytes.count else { throw fail("an object is not closed") }
                    if bytes[at] == UInt8(ascii: ",") { at += 1; continue }
                    if bytes[at] == UInt8(ascii: "}") { at += 1; return .dictionary(fields) }
                    throw fail("expected ',' or '}'")
                }
            case UInt8(ascii: "["):
                at += 1
                var items: [PlistValue] = []
                skipSpace()
                if at < bytes.count, bytes[at] == UInt8(ascii: "]") { at += 1; return .array(items) }
                while true {
                    items.append(try value(depth: depth + 1))
                    skipSpace()
                    guard at < bytes.count else { throw fail("an array is not closed") }
                    if bytes[at] == UInt8(ascii: ",") { at += 1; continue }
                    if bytes[at] == UInt8(ascii: "]") { at += 1; return .array(items) }
                    throw fail("expected ',' or ']'")
                }
            case UInt8(ascii: "\""): return .string(try string())
            case UInt8(ascii: "t"): try expect("true"); return .bool(true)
            case UInt8(ascii: "f"): try expect("false"); return .bool(false)
            case UInt8(ascii: "n"): throw fail("null has no property-list form; leave the key out")
            default: return try number()
            }
        }

        mutating func string() throws(Failure) -> String {
            at += 1  // the opening quote
            var out: [UInt8] = []
            while at < bytes.count {
                let b = bytes[at]
                at += 1
                switch b {
                case UInt8(ascii: "\""): return String(decoding: out, as: UTF8.self)
                case UInt8(ascii: "\\"):
                    guard at < bytes.count else { break }
                    let e = bytes[at]
                    at += 1
                    switch e {
                    case UInt8(ascii: "n"): out.append(0x0A)
                    case UInt8(ascii: "t"): out.append(0x09)
                    case UInt8(ascii: "r"): out.append(0x0D)
                    case UInt8(ascii: "b"): out.append(0x08)
                    case UInt8(ascii: "f"): out.append(0x0C)
                    case UInt8(ascii: "u"):
                        guard at + 4 <= bytes.count, let unit = UInt32(String(decoding: bytes[at..<at + 4], as: UTF8.self), radix: 16)
                        else { throw fail("a \\u escape needs four hex digits") }
                        at += 4
                        var scalar = unit
                        // A surrogate pair: the high half, then \uDC00...\uDFFF.
                        if (0xD800..<0xDC00).contains(unit), at + 6 <= bytes.count, bytes[at] == UInt8(ascii: "\\"),
                            bytes[at + 1] == UInt8(ascii: "u"),
                            let low = UInt32(String(decoding: bytes[at + 2..<at + 6], as: UTF8.self), radix: 16),
                            (0xDC00..<0xE000).contains(low)
                        {
                            at += 6
                            scalar = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                        }
                        guard let s = Unicode.Scalar(scalar) else { throw fail("\\u\(String(unit, radix: 16)) is not a character") }
                        out += Array(String(Character(s)).utf8)
                    default: out.append(e)  // \" \\ \/
                    }
                default:
                    guard b >= 0x20 else { throw fail("a control character inside a string") }
                    out.append(b)
                }
            }
            throw fail("a string is not closed")
        }

        mutating func number() throws(Failure) -> PlistValue {
            let start = at
            while at < bytes.count, "+-0123456789.eE".utf8.contains(bytes[at]) { at += 1 }
            let text = String(decoding: bytes[start..<at], as: UTF8.self)
            if let n = Int64(text) { return .integer(n) }
            // A whole number past Int64 is refused, not sent as the nearest real (18446744073709551615 arrived as
            // 1.8446744073709552e+19, and nothing said so).
            if !text.utf8.contains(where: { ".eE".utf8.contains($0) }), Double(text) != nil {
                at = start
                throw fail("'\(text)' is a whole number outside the 64-bit range; write it as a string, or as a real (with a '.')")
            }
            if let d = Double(text), d.isFinite { return .real(d) }
            at = start
            throw fail(text.isEmpty ? "expected a value" : "'\(text)' is not a number")
        }
    }
}
