// `sdk-host bench --soak N`, the short version the suite can afford (docs/BENCHMARKS.md quotes the long runs): real crashes,
// cancels and deadlines in an embedded host, then every request ended once, no worker or descriptor left, and
// resident memory that does not grow with the request count.
import SDKWire
import HostTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct SoakTests {
    struct Report: Decodable {
        var requests: Int
        var callbacks: Int
        var slope_bytes_per_request: Double
        var workers_after_shutdown: Int
        var descriptors_start: Int
        var descriptors_after_shutdown: Int
        var outcomes: [String: Int]
    }

    @Test func aShortSoakEndsEveryRequestOnceAndKeepsMemoryFlat() async throws {
        var template = "/tmp/sdkhost-soak-XXXXXX".utf8CString
        let folder = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        defer { removeFolder(folder) }
        let report = try await decodeOutput(Report.self, of: [sdkHostBinary, "bench", "--soak", "12000", "--json"],
                                            in: folder, timeout: 300)
        #expect(report.requests == 12000 && report.callbacks == 12000)
        #expect(report.outcomes.values.reduce(0, +) == 12000)
        for kind in ["completed", "cancelled", "signal", "timedOut"] {
            #expect((report.outcomes[kind] ?? 0) > 0, "no \(kind) outcome in \(report.outcomes)")
        }
        #expect(report.workers_after_shutdown == 0)
        #expect(report.descriptors_after_shutdown <= report.descriptors_start + 1)
        // A generous bound for 12k requests on a noisy machine; a leak of half a KiB per request fails it.
        #expect(report.slope_bytes_per_request < 512, "RSS grows \(report.slope_bytes_per_request) bytes per request")
    }
}
