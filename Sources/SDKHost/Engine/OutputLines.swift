// OutputLines: a worker's stdout or stderr turned into log lines a worker cannot abuse. Bytes are split at
// newlines (a line longer than `maxLineBytes` is cut), control characters are escaped (\n, \r, \e... cannot
// forge a host log line or a terminal sequence), and a token bucket limits lines per second: the excess is
// counted and reported, never queued. The crash report's raw stderr tail is kept separately.

struct OutputLines {
    static let maxLineBytes = 4096
    /// Lines a worker may log in a burst, and the steady rate after it.
    static let burst = 200.0
    static let linesPerSecond = 100.0

    private var partial: [UInt8] = []
    private var tokens = OutputLines.burst
    private var refilledAt: UInt64 = 0
    /// Lines dropped since the last report.
    private(set) var dropped = 0

    /// Feeds bytes; calls `emit` with each complete line that the rate allows, escaped.
    mutating func append(_ chunk: UnsafeRawBufferPointer, now: UInt64, emit: (String) -> Void) {
        for byte in chunk {
            if byte == UInt8(ascii: "\n") {
                finishLine(now: now, emit: emit)
            } else {
                partial.append(byte)
                if partial.count >= Self.maxLineBytes { finishLine(now: now, emit: emit) }
            }
        }
    }

    /// Emits what is left of an unterminated line (at EOF).
    mutating func flush(now: UInt64, emit: (String) -> Void) {
        if !partial.isEmpty { finishLine(now: now, emit: emit) }
    }

    /// Takes the count of dropped lines, for a summary line.
    mutating func takeDropped() -> Int {
        defer { dropped = 0 }
        return dropped
    }

    private mutating func finishLine(now: UInt64, emit: (String) -> Void) {
        defer { partial.removeAll(keepingCapacity: partial.count <= Self.maxLineBytes) }
        if refilledAt == 0 { refilledAt = now }
        tokens = min(Self.burst, tokens + Double(now &- refilledAt) / 1e9 * Self.linesPerSecond)
        refilledAt = now
        guard tokens >= 1 else {
            dropped += 1
            return
        }
        tokens -= 1
        emit(Self.escape(partial))
    }

    /// UTF-8 text as a log line: control characters written out (`String.displaySafe`, the one table every
    /// log and terminal line goes through), and each invalid byte, which decodes to U+FFFD, as \\ufffd.
    static func escape(_ bytes: [UInt8]) -> String {
        String(decoding: bytes, as: UTF8.self).displaySafe(markingReplacements: true)
    }
}
