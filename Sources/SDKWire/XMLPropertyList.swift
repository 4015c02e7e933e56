// A strict reader for XML property lists (Apple's plist DTD), for manifests and configuration files: small
// files, read once, so clarity beats speed. Stdlib only, so the host engine and daemon need no Foundation.
// Errors carry the line number. Accepts what plistlib and Foundation write: a prolog, a DOCTYPE, comments,
// <plist> around one value, the empty-element forms, base64 <data> and ISO 8601 UTC <date>.

/// A malformed XML property list; `line` is 1-based.
public struct XMLPlistError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The line where the problem was found.
    public let line: Int
    /// What is wrong.
    public let detail: String
    public var description: String { "line \(line): \(detail)" }
}

/// A value that an XML property list cannot carry.
public struct XMLRenderError: Error, Hashable, Sendable, CustomStringConvertible {
    /// Where in the value: "items[0].date", or "the top value".
    public let path: String
    /// What is wrong.
    public let detail: String
    public var description: String { "\(path): \(detail)" }
}

/// Parses XML property lists into `PlistValue`s.
public enum XMLPropertyList {
    /// Parses a complete XML property list.
    ///
    /// - Throws: `XMLPlistError` naming the line and the problem.
    public static func parse(_ text: String) throws(XMLPlistError) -> PlistValue {
        var parser = XMLParser(Array(text.utf8))
        return try parser.document()
    }

    /// Parses a complete XML property list from bytes (UTF-8).
    public static func parse(_ bytes: [UInt8]) throws(XMLPlistError) -> PlistValue {
        var parser = XMLParser(bytes)
        return try parser.document()
    }
}

private struct XMLParser {
    let s: [UInt8]
    var i = 0
    var depth = 0

    init(_ s: [UInt8]) { self.s = s }

    var line: Int { 1 + s[0..<min(i, s.count)].reduce(0) { $0 + ($1 == 10 ? 1 : 0) } }

    func fail(_ detail: String) -> XMLPlistError { XMLPlistError(line: line, detail: detail) }

    mutating func document() throws(XMLPlistError) -> PlistValue {
        if s.starts(with: [0xEF, 0xBB, 0xBF]) { i = 3 }  // UTF-8 byte order mark
        try skipMisc()
        var wrapped = false
        if peek("<plist") {
            _ = try tag()
            wrapped = true
            try skipMisc()
        }
        let value = try self.value()
        try skipMisc()
        if wrapped {
            guard try tag() == (name: "plist", closing: true, empty: false) else { throw fail("expected </plist>") }
            try skipMisc()
        }
        guard i == s.count else { throw fail("unexpected content after the top-level value") }
        return value
    }

    /// Whether the input at `i` starts with `text` (compared in place: this runs at every markup position, and a
    /// copy of each side made two arrays a call).
    func peek(_ text: StaticString) -> Bool { matches(text, at: i) }

    func matches(_ text: StaticString, at position: Int) -> Bool {
        let n = text.utf8CodeUnitCount
        guard s.count - position >= n else { return false }
        let bytes = text.utf8Start
        for k in 0..<n where s[position + k] != bytes[k] { return false }
        return true
    }

    /// Skips whitespace, <?...?>, <!DOCTYPE ...> and comments.
    mutating func skipMisc() throws(XMLPlistError) {
        while i < s.count {
            if s[i] == 32 || s[i] == 9 || s[i] == 10 || s[i] == 13 {
                i += 1
            } else if peek("<?") {
                try skip(past: "?>")
            } else if peek("<!--") {
                try skip(past: "-->")
            } else if peek("<!") {
                try skip(past: ">")
            } else {
                return
            }
        }
    }

    mutating func skip(past terminator: StaticString) throws(XMLPlistError) {
        while i < s.count {
            if matches(terminator, at: i) {
                i += terminator.utf8CodeUnitCount
                return
            }
            i += 1
        }
        throw fail("unterminated markup, expected '\(terminator)'")
    }

    /// Reads one tag: its name, whether it is a closing tag, whether it is empty (`<x/>`). Attributes are skipped.
    mutating func tag() throws(XMLPlistError) -> (name: String, closing: Bool, empty: Bool) {
        guard i < s.count, s[i] == UInt8(ascii: "<") else { throw fail("expected a tag") }
        i += 1
        var closing = false
        if i < s.count, s[i] == UInt8(ascii: "/") {
            closing = true
            i += 1
        }
        let start = i
        while i < s.count, s[i] != UInt8(ascii: ">"), s[i] != UInt8(ascii: "/"), s[i] != 32, s[i] != 9, s[i] != 10 {
            i += 1
        }
        let name = String(decoding: s[start..<i], as: UTF8.self)
        var empty = false
        while i < s.count, s[i] != UInt8(ascii: ">") {
            if s[i] == UInt8(ascii: "/") { empty = true }
            i += 1
        }
        guard i < s.count else { throw fail("unterminated tag <\(name)") }
        i += 1
        return (name, closing, empty)
    }

    /// Reads character data up to the next '<', decoding entities.
    mutating func text() throws(XMLPlistError) -> String {
        var out: [UInt8] = []
        while i < s.count, s[i] != UInt8(ascii: "<") {
            if s[i] == UInt8(ascii: "&") {
                guard let semi = s[i...].firstIndex(of: UInt8(ascii: ";")), semi - i <= 10 else {
                    throw fail("unterminated entity")
                }
                let entity = String(decoding: s[(i + 1)..<semi], as: UTF8.self)
                switch entity {
                case "amp": out.append(UInt8(ascii: "&"))
                case "lt": out.append(UInt8(ascii: "<"))
                case "gt": out.append(UInt8(ascii: ">"))
                case "quot": out.append(UInt8(ascii: "\""))
                case "apos": out.append(UInt8(ascii: "'"))
                default:
                    let scalar: UInt32?
                    if entity.hasPrefix("#x") {
                        scalar = UInt32(entity.dropFirst(2), radix: 16)
                    } else if entity.hasPrefix("#") {
                        scalar = UInt32(entity.dropFirst(1))
                    } else {
                        scalar = nil
                    }
                    guard let scalar, let u = Unicode.Scalar(scalar) else { throw fail("unknown entity &\(entity);") }
                    out.append(contentsOf: Array(String(Character(u)).utf8))
                }
                i = semi + 1
            } else {
                out.append(s[i])
                i += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Reads the text of a simple element whose opening tag was just read, and its closing tag.
    mutating func content(of name: String, empty: Bool) throws(XMLPlistError) -> String {
        if empty { return "" }
        let t = try text()
        let close = try tag()
        guard close.closing, close.name == name else { throw fail("expected </\(name)>, found <\(close.name)>") }
        return t
    }

    mutating func value() throws(XMLPlistError) -> PlistValue {
        try skipMisc()
        let open = try tag()
        guard !open.closing else { throw fail("unexpected </\(open.name)>") }
        switch open.name {
        case "string":
            return .string(try content(of: "string", empty: open.empty))
        case "integer":
            let t = try content(of: "integer", empty: open.empty).trimmingWhitespace
            guard let v = Int64(t.hasPrefix("+") ? String(t.dropFirst()) : t) else {
                throw fail("'\(t)' is not a 64-bit integer")
            }
            return .integer(v)
        case "real":
            let t = try content(of: "real", empty: open.empty).trimmingWhitespace
            guard let v = Double(t) else { throw fail("'\(t)' is not a real number") }
            return .real(v)
        case "true", "false":
            _ = try content(of: open.name, empty: open.empty)
            return .bool(open.name == "true")
        case "data":
            let t = try content(of: "data", empty: open.empty)
            guard let bytes = Base64.decode(t) else { throw fail("<data> is not valid base64") }
            return .data(bytes)
        case "date":
            let t = try content(of: "date", empty: open.empty).trimmingWhitespace
            guard let d = ISO8601.parse(t) else { throw fail("'\(t)' is not a date of the form 2001-01-01T00:00:00Z") }
            return .date(d)
        case "array":
            if open.empty { return .array([]) }
            depth += 1
            defer { depth -= 1 }
            guard depth <= 512 else { throw fail("nesting deeper than 512") }
            var elements: [PlistValue] = []
            while true {
                try skipMisc()
                if peek("</") {
                    let close = try tag()
                    guard close.name == "array" else { throw fail("expected </array>, found </\(close.name)>") }
                    return .array(elements)
                }
                elements.append(try value())
            }
        case "dict":
            if open.empty { return .dictionary([:]) }
            depth += 1
            defer { depth -= 1 }
            guard depth <= 512 else { throw fail("nesting deeper than 512") }
            var entries: [String: PlistValue] = [:]
            while true {
                try skipMisc()
                if peek("</") {
                    let close = try tag()
                    guard close.name == "dict" else { throw fail("expected </dict>, found </\(close.name)>") }
                    return .dictionary(entries)
                }
                let keyTag = try tag()
                guard keyTag.name == "key", !keyTag.closing else { throw fail("expected <key> in <dict>, found <\(keyTag.name)>") }
                let key = try content(of: "key", empty: keyTag.empty)
                guard entries[key] == nil else { throw fail("duplicate key '\(key)'") }
                entries[key] = try value()
            }
        default:
            throw fail("unknown element <\(open.name)>")
        }
    }
}

extension String {
    var trimmingWhitespace: String {
        let scalars = unicodeScalars.drop { $0.properties.isWhitespace }.reversed().drop { $0.properties.isWhitespace }
        return String(String.UnicodeScalarView(scalars.reversed()))
    }
}

enum Base64 {
    static func decode(_ text: String) -> [UInt8]? {
        var out: [UInt8] = []
        var accumulator: UInt32 = 0
        var bits = 0
        for c in text.utf8 {
            let v: UInt32
            switch c {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): v = UInt32(c - UInt8(ascii: "A"))
            case UInt8(ascii: "a")...UInt8(ascii: "z"): v = UInt32(c - UInt8(ascii: "a") + 26)
            case UInt8(ascii: "0")...UInt8(ascii: "9"): v = UInt32(c - UInt8(ascii: "0") + 52)
            case UInt8(ascii: "+"): v = 62
            case UInt8(ascii: "/"): v = 63
            case UInt8(ascii: "="), 32, 9, 10, 13: continue
            default: return nil
            }
            accumulator = accumulator << 6 | v
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
            }
        }
        return out
    }
}

enum ISO8601 {
    /// Parses "YYYY-MM-DDTHH:MM:SSZ" (UTC, as plist writers emit it).
    static func parse(_ t: String) -> PlistDate? {
        let u = Array(t.utf8)
        guard u.count == 20, u[4] == UInt8(ascii: "-"), u[7] == UInt8(ascii: "-"), u[10] == UInt8(ascii: "T"),
            u[13] == UInt8(ascii: ":"), u[16] == UInt8(ascii: ":"), u[19] == UInt8(ascii: "Z")
        else { return nil }
        func number(_ r: Range<Int>) -> Int? {
            var v = 0
            for k in r {
                guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(u[k]) else { return nil }
                v = v * 10 + Int(u[k] - UInt8(ascii: "0"))
            }
            return v
        }
        guard let y = number(0..<4), let mo = number(5..<7), let d = number(8..<10), let h = number(11..<13),
            let mi = number(14..<16), let sec = number(17..<19), (1...12).contains(mo), (1...31).contains(d),
            h < 24, mi < 60, sec < 61
        else { return nil }
        // Days from civil (Howard Hinnant's algorithm), relative to 1970-01-01.
        let yy = mo <= 2 ? y - 1 : y
        let era = (yy >= 0 ? yy : yy - 399) / 400
        let yoe = yy - era * 400
        let doy = (153 * (mo + (mo > 2 ? -3 : 9)) + 2) / 5 + d - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146_097 + doe - 719_468
        return PlistDate(secondsSince1970: Double(days * 86_400 + h * 3600 + mi * 60 + sec))
    }
}

extension XMLPropertyList {
    /// Renders `value` as an XML property list in the layout plistlib and Foundation write (tabs, one element
    /// per line). Dictionary keys are sorted, so output is deterministic.
    ///
    /// - Throws: `XMLRenderError` for a value XML cannot carry: a date that is NaN, infinite or outside years
    ///   1 to 9999 (a peer can send one in bplist00, so this is an error, never a trap).
    public static func render(_ value: PlistValue) throws(XMLRenderError) -> String {
        var out = """
            <?xml version="1.0" encoding="UTF-8"?>
            <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
            <plist version="1.0">

            """
        try renderValue(value, indent: 0, path: "", into: &out)
        out += "</plist>\n"
        return out
    }

    private static func renderValue(_ value: PlistValue, indent: Int, path: String, into out: inout String)
        throws(XMLRenderError)
    {
        let pad = String(repeating: "\t", count: indent)
        switch value {
        case .string(let s): out += "\(pad)<string>\(escape(s))</string>\n"
        case .integer(let i): out += "\(pad)<integer>\(i)</integer>\n"
        case .real(let d):
            let text = d.isNaN ? "nan" : d == .infinity ? "inf" : d == -.infinity ? "-inf" : "\(d)"
            out += "\(pad)<real>\(text)</real>\n"
        case .bool(let b): out += "\(pad)<\(b ? "true" : "false")/>\n"
        case .date(let d):
            guard let text = ISO8601.format(d) else {
                throw XMLRenderError(path: path.isEmpty ? "the top value" : path,
                    detail: "date \(d.secondsSinceReferenceDate) s since 2001 cannot be written as an XML date")
            }
            out += "\(pad)<date>\(text)</date>\n"
        case .data(let bytes): out += "\(pad)<data>\(Base64.encode(bytes))</data>\n"
        case .array(let a):
            if a.isEmpty { out += "\(pad)<array/>\n"; return }
            out += "\(pad)<array>\n"
            for (i, e) in a.enumerated() { try renderValue(e, indent: indent + 1, path: "\(path)[\(i)]", into: &out) }
            out += "\(pad)</array>\n"
        case .dictionary(let d):
            if d.isEmpty { out += "\(pad)<dict/>\n"; return }
            out += "\(pad)<dict>\n"
            for key in d.keys.sorted() {
                out += "\(pad)\t<key>\(escape(key))</key>\n"
                try renderValue(d[key]!, indent: indent + 1, path: path.isEmpty ? key : "\(path).\(key)", into: &out)
            }
            out += "\(pad)</dict>\n"
        }
    }

    static func escape(_ s: String) -> String {
        var out = ""
        out.reserveCapacity(s.utf8.count)
        for c in s.unicodeScalars {
            switch c {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            default: out.unicodeScalars.append(c)
            }
        }
        return out
    }
}

extension Base64 {
    static func encode(_ bytes: [UInt8]) -> String {
        let table = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i < bytes.count {
            let b0 = UInt32(bytes[i])
            let b1 = i + 1 < bytes.count ? UInt32(bytes[i + 1]) : 0
            let b2 = i + 2 < bytes.count ? UInt32(bytes[i + 2]) : 0
            let n = b0 << 16 | b1 << 8 | b2
            out.append(table[Int(n >> 18 & 63)])
            out.append(table[Int(n >> 12 & 63)])
            out.append(i + 1 < bytes.count ? table[Int(n >> 6 & 63)] : UInt8(ascii: "="))
            out.append(i + 2 < bytes.count ? table[Int(n & 63)] : UInt8(ascii: "="))
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }
}

extension ISO8601 {
    /// "YYYY-MM-DDTHH:MM:SSZ" (whole seconds, UTC), the inverse of `parse`; nil for a date that is not finite or
    /// lies outside years 1...9999.
    static func format(_ date: PlistDate) -> String? {
        // 0001-01-01 and 10000-01-01 in seconds since 1970.
        let seconds = date.secondsSince1970
        guard seconds.isFinite, seconds >= -62_135_596_800, seconds < 253_402_300_800 else { return nil }
        let total = Int(seconds.rounded(.down))
        var days = total >= 0 ? total / 86_400 : (total - 86_399) / 86_400
        let secs = total - days * 86_400
        // Civil from days (Howard Hinnant's algorithm).
        days += 719_468
        let era = (days >= 0 ? days : days - 146_096) / 146_097
        let doe = days - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        let y = yoe + era * 400 + (m <= 2 ? 1 : 0)
        func two(_ n: Int) -> String { n < 10 ? "0\(n)" : "\(n)" }
        let year = String(y)
        return String(repeating: "0", count: max(0, 4 - year.count)) + year
            + "-\(two(m))-\(two(d))T\(two(secs / 3600)):\(two(secs / 60 % 60)):\(two(secs % 60))Z"
    }
}
