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
    private var budget = LineBudget()

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

    /// Takes the count of dropped lines for a summary line, at most once a second unless `force` (at the end).
    mutating func takeDropped(now: UInt64, force: Bool = false) -> Int { budget.takeDropped(now: now, force: force) }

    /// Lines dropped and not counted yet.
    var uncounted: Int { budget.dropped }

    private mutating func finishLine(now: UInt64, emit: (String) -> Void) {
        defer { partial.removeAll(keepingCapacity: partial.count <= Self.maxLineBytes) }
        guard budget.allow(now: now) else { return }
        emit(Self.escape(partial))
    }

    /// UTF-8 text as a log line: control characters written out (`String.displaySafe`, the one table every
    /// log and terminal line goes through), and each invalid byte, which decodes to U+FFFD, as \\ufffd.
    static func escape(_ bytes: [UInt8]) -> String {
        String(decoding: bytes, as: UTF8.self).displaySafe(markingReplacements: true)
    }
}

/// A token bucket of log lines (`OutputLines.burst`, then `linesPerSecond`): what a worker's output may log, and
/// what its messages may (an `error` it sends, a type no version knows, a duplicate reply, a refused call), so
/// that neither a flood of output nor of messages floods the host's log. What it refuses is counted, and the
/// count reported at most once a second.
struct LineBudget {
    private var tokens = OutputLines.burst
    private var refilledAt: UInt64 = 0
    private var reportedAt: UInt64 = 0
    /// Lines refused since the last report.
    private(set) var dropped = 0

    /// Whether one more line may be logged at `now`; if not, it is counted.
    mutating func allow(now: UInt64) -> Bool {
        if refilledAt == 0 { refilledAt = now }
        tokens = min(OutputLines.burst, tokens + Double(now &- refilledAt) / 1e9 * OutputLines.linesPerSecond)
        refilledAt = now
        guard tokens >= 1 else {
            dropped += 1
            return false
        }
        tokens -= 1
        return true
    }

    /// The lines refused since the last report, if a second has passed since it (or `force`); 0 otherwise.
    mutating func takeDropped(now: UInt64, force: Bool) -> Int {
        guard dropped > 0, force || now &- reportedAt >= 1_000_000_000 else { return 0 }
        reportedAt = now
        defer { dropped = 0 }
        return dropped
    }
}
