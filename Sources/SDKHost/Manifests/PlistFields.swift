// PlistFields: typed access to a dictionary read from a manifest or config file, with errors that name the
// file and the key path ("Extensions/Echo/Info.plist: NSExtension.SDKHostPolicy.MaxWorkers: expected an
// integer, found a string").

package struct PlistFields {
    package let entries: [String: PlistValue]
    package let file: String
    package let path: String
    package let errorCode: HostError.Code

    package init(_ value: PlistValue, file: String, path: String = "", errorCode: HostError.Code) throws(HostError) {
        guard case .dictionary(let d) = value else {
            throw HostError(errorCode, "\(file): \(path.isEmpty ? "top level" : path): expected a dictionary, found \(value.kindName)")
        }
        entries = d
        self.file = file
        self.path = path
        self.errorCode = errorCode
    }

    package func keyPath(_ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    package func fail(_ key: String, _ detail: String) -> HostError {
        HostError(errorCode, "\(file): \(keyPath(key)): \(detail)")
    }

    package func mismatch(_ key: String, expected: String, found: PlistValue) -> HostError {
        fail(key, "expected \(expected), found \(found.kindName)")
    }

    package func string(_ key: String) throws(HostError) -> String? {
        guard let v = entries[key] else { return nil }
        guard case .string(let s) = v else { throw mismatch(key, expected: "a string", found: v) }
        return s
    }

    package func requiredString(_ key: String) throws(HostError) -> String {
        guard let s = try string(key) else { throw fail(key, "missing (required)") }
        guard !s.isEmpty else { throw fail(key, "must not be empty") }
        return s
    }

    package func integer(_ key: String, in range: ClosedRange<Int>) throws(HostError) -> Int? {
        guard let v = entries[key] else { return nil }
        guard case .integer(let i) = v else { throw mismatch(key, expected: "an integer", found: v) }
        guard let n = Int(exactly: i), range.contains(n) else {
            throw fail(key, "\(i) is outside \(range.lowerBound)...\(range.upperBound)")
        }
        return n
    }

    /// A number of seconds: integer or real, at least `minimum` and at most `maximumSeconds` (about three years;
    /// a larger value would overflow the nanosecond arithmetic of timers).
    package func seconds(_ key: String, minimum: Double) throws(HostError) -> Double? {
        guard let v = entries[key] else { return nil }
        guard let d = v.doubleValue, v.boolValue == nil else { throw mismatch(key, expected: "a number", found: v) }
        guard d >= minimum, d.isFinite else { throw fail(key, "\(d) must be at least \(minimum)") }
        guard d <= maximumSeconds else { throw fail(key, "\(d) is more than the maximum of \(Int(maximumSeconds)) s") }
        return d
    }

    package func bool(_ key: String) throws(HostError) -> Bool? {
        guard let v = entries[key] else { return nil }
        guard case .bool(let b) = v else { throw mismatch(key, expected: "a boolean", found: v) }
        return b
    }

    package func stringArray(_ key: String) throws(HostError) -> [String]? {
        guard let v = entries[key] else { return nil }
        guard case .array(let a) = v else { throw mismatch(key, expected: "an array of strings", found: v) }
        var out: [String] = []
        for (i, e) in a.enumerated() {
            guard case .string(let s) = e else { throw mismatch("\(key)[\(i)]", expected: "a string", found: e) }
            out.append(s)
        }
        return out
    }

    package func fields(_ key: String) throws(HostError) -> PlistFields? {
        guard let v = entries[key] else { return nil }
        return try PlistFields(v, file: file, path: keyPath(key), errorCode: errorCode)
    }

    /// Rejects keys outside `known`, naming the first (sorted) one.
    package func rejectUnknownKeys(_ known: Set<String>) throws(HostError) {
        if let unknown = entries.keys.filter({ !known.contains($0) }).sorted().first {
            throw fail(unknown, "unknown key (known: \(known.sorted().joined(separator: ", ")))")
        }
    }
}
