// The bench's streaming and large-payload figures (DESIGN "Streaming and large payloads"): a payload echoed
// through a descriptor attachment against the same bytes as data split over frames (`attachment_speedup`,
// target ≥ 20× for 1 GiB), and Ticker's partial results read from `Extension.stream` as fast as they come
// (events per second, and the latency from the worker making one to the app having it).
import Dispatch
import SDKHost
import SDKPosix
import CSDKShim

#if canImport(Glibc)
import Glibc
#endif

enum StreamBench {
    struct AttachmentResult: Sendable {
        var bytes: Int
        /// Median milliseconds to echo the payload as one descriptor, and as data frames.
        var descriptorMs: Double
        var dataMs: Double
    }

    /// Data frames carry this much each (under the 16 MiB frame limit with room for the envelope).
    static let chunkBytes = 8 << 20

    static func attachment(_ host: ExtensionHost, bytes total: Int, rounds: Int) -> AttachmentResult {
        let ext = EmbeddedBench.echo(host)
        let chunk = (0..<chunkBytes).map { UInt8(truncatingIfNeeded: $0 &* 2_654_435_761 >> 13) }
        // The payload, made once: a memfd the app could have generated.
        let fd = sdk_memfd("bench-payload")
        guard fd >= 0 else { fail("bench: memfd_create: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var written = 0
        while written < total {
            let n = min(chunkBytes, total - written)
            chunk.withUnsafeBytes { raw in
                let r = Result { () throws(SystemError) in try writeAll(fd, UnsafeRawBufferPointer(rebasing: raw[0..<n]), detail: "memfd") }
                if case .failure(let error) = r { fail("bench: \(error)") }
            }
            written += n
        }
        func perform(_ items: [ExtensionItem]) -> [ExtensionItem] {
            let result = runAsync { () -> Result<[ExtensionItem], any Error> in
                do { return .success(try await ext.perform(items, deadline: .seconds(600))) } catch { return .failure(error) }
            }
            switch result {
            case .success(let items): return items
            case .failure(let error): fail("bench: attachment echo failed: \(error)")
            }
        }
        var descriptor = Samples()
        var data = Samples()
        for _ in 0..<rounds {
            var start = nowMicros()
            let attachment: FileAttachment
            do { attachment = try FileAttachment(duplicating: fd) } catch { fail("bench: \(error)") }
            let back = perform([ExtensionItem(fileAttachments: [attachment])])
            guard back.first?.fileAttachments.first?.size == total else { fail("bench: the descriptor came back wrong") }
            descriptor.add(nowMicros() - start)

            start = nowMicros()
            var echoed = 0
            var offset = 0
            while offset < total {
                let n = min(chunkBytes, total - offset)
                let piece = n == chunkBytes ? chunk : Array(chunk[0..<n])
                echoed += perform([ExtensionItem(attachments: [.data(piece)])]).first?.attachments.first?.dataValue?.count ?? 0
                offset += n
            }
            guard echoed == total else { fail("bench: \(echoed) of \(total) bytes came back as data") }
            data.add(nowMicros() - start)
        }
        return AttachmentResult(bytes: total, descriptorMs: descriptor.percentile(0.5) / 1000, dataMs: data.percentile(0.5) / 1000)
    }

    struct StreamResult: Sendable {
        var eventsPerSecond: Double
        /// Microseconds from the worker making a partial result to the app taking it from the stream.
        var latency: Samples
    }

    static func streaming(_ host: ExtensionHost, events: Int) -> StreamResult {
        let ticker: Extension
        do { ticker = try host.extension(identifier: "com.example.ticker") } catch { fail("bench: \(error)") }
        return runAsync {
            var latency = Samples()
            var received = 0
            let start = nowMicros()
            do {
                for try await batch in ticker.stream([ExtensionItem(text: "\(events):0")], deadline: .seconds(600)) {
                    let now = Double(monotonicNanoseconds())
                    if let made = batch.first?.userInfo["madeAtNs"]?.integerValue {
                        received += 1
                        latency.add((now - Double(made)) / 1000)
                    }
                }
            } catch {
                fail("bench: the Ticker stream failed: \(error)")
            }
            guard received == events else { fail("bench: \(received) of \(events) partial results arrived") }
            return StreamResult(eventsPerSecond: Double(events) / ((nowMicros() - start) / 1e6), latency: latency)
        }
    }
}
