// Timing for benchmarks: the median over seven runs of the mean time per call.

/// Runs `body` `iterations / 10` times to warm up, then seven runs of `iterations` calls; returns the median of
/// the seven mean times per call, in microseconds.
public func medianMicrosecondsPerCall(_ iterations: Int, _ body: () -> Void) -> Double {
    for _ in 0..<(iterations / 10) { body() }
    var runs: [Double] = []
    for _ in 0..<7 {
        let start = monotonicNanoseconds()
        for _ in 0..<iterations { body() }
        runs.append(Double(monotonicNanoseconds() - start) / 1000 / Double(iterations))
    }
    return runs.sorted()[3]
}
