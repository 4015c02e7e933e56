// Text from a peer (a reply's title, an error message, a bad id, an app name, a worker's output) shown on a
// terminal or written to a log: control characters are written out, never interpreted. A peer cannot move the
// cursor, retitle the terminal, forge a log line with a newline, or reorder text with bidirectional overrides.

extension String {
    /// This text with C0 controls, DEL, C1 controls and bidirectional overrides written as `\xNN` or `\u{NNNN}`;
    /// tab is kept, and newline too when `keepingNewlines` (for the CLI's own multi-line output). With
    /// `markingReplacements`, U+FFFD (what an invalid UTF-8 byte decodes to) is written as `\ufffd`.
    package func displaySafe(keepingNewlines: Bool = false, markingReplacements: Bool = false) -> String {
        func unsafe(_ v: UInt32) -> Bool {
            (v < 0x20 && v != 0x09 && !(keepingNewlines && v == 0x0A)) || (0x7F..<0xA0).contains(v)
                || (0x202A...0x202E).contains(v) || (0x2066...0x2069).contains(v) || (markingReplacements && v == 0xFFFD)
        }
        guard unicodeScalars.contains(where: { unsafe($0.value) }) else { return self }
        var out = ""
        out.reserveCapacity(utf8.count + 8)
        for scalar in unicodeScalars {
            let v = scalar.value
            if !unsafe(v) {
                out.unicodeScalars.append(scalar)
            } else if v == 0xFFFD {
                out += "\\ufffd"
            } else if v < 0x100 {
                out += "\\x" + (v < 16 ? "0" : "") + String(v, radix: 16)
            } else {
                out += "\\u{" + String(v, radix: 16) + "}"
            }
        }
        return out
    }
}
