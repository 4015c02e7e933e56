// Ticker (com.example.ticker): streams partial results. The first item's text (or title) is "N:MS": send N
// partial results, each MS milliseconds after the one before (the first MS after the start), then complete with one item saying how many were sent. Partial result i
// (1...N) has title "tick i/N", text "i", and userInfo {index: i, madeAtNs: CLOCK_MONOTONIC when it was made, just
// before `send`}, so a test can see when the worker got to each one (the clock is the same in every process). A host cancel ends
// the stream at once (cancelled); "N:MS" that does not parse cancels with an error saying so. "N:MS:F" attaches F
// sealed memfds (1...64) to each partial result, each holding the tick's index as text.
import SDKExtension

#if canImport(Glibc)
import Glibc
#endif

@main
struct Ticker: AsyncRequestHandler {
    static let maxTicks = 1_000_000
    static let maxIntervalMs = 60_000

    func beginRequest(with context: ExtensionContext) async {
        let spec = context.inputItems.first.flatMap { $0.text ?? $0.title } ?? ""
        let parts = spec.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2 || parts.count == 3, let count = Int(parts[0]), let interval = Int(parts[1]),
            (0...Self.maxTicks).contains(count), (0...Self.maxIntervalMs).contains(interval),
            let files = parts.count == 3 ? Int(parts[2]) : 0, (0...64).contains(files)
        else {
            context.cancelRequest(withError: ExtensionError(
                domain: "com.example.ticker", code: 1,
                message: "the first item's text must be N:MS or N:MS:F (N in 0...\(Self.maxTicks), MS in "
                    + "0...\(Self.maxIntervalMs), F in 0...64), not '\(spec)'"))
            return
        }
        for index in stride(from: 1, through: count, by: 1) {
            if interval > 0 {
                do {
                    try await Task.sleep(nanoseconds: UInt64(interval) * 1_000_000)
                } catch {
                    return  // cancelled by the host: the runtime ends the request as cancelled
                }
            }
            var attachments: [FileAttachment] = []
            for _ in 0..<files {
                guard let file = try? FileAttachment(bytes: Array("\(index)".utf8)) else { break }
                attachments.append(file)
            }
            let tick = ExtensionItem(title: "tick \(index)/\(count)", text: "\(index)",
                                     userInfo: ["index": .integer(Int64(index)), "madeAtNs": .integer(Self.now())],
                                     fileAttachments: attachments)
            guard await context.send([tick]) else { return }
        }
        context.completeRequest(returningItems: [ExtensionItem(title: "done", text: "\(count) ticks")])
    }

    static func now() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }
}
