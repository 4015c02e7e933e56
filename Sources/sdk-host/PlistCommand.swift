// `sdk-host plist encode|decode`: convert between XML property lists and our wire payloads, to inspect
// captured messages or craft test input. Uses SDKWire's own XML reader and writer (no Foundation in sdk-host).
import SDKWire

#if canImport(Glibc)
import Glibc
#endif

enum PlistCommand {
    static let usage = """
        usage: sdk-host plist encode|decode
          encode   an XML property list on stdin -> the wire's bplist00 on stdout
          decode   bplist00 on stdin -> an XML property list on stdout
        """

    static func run(_ arguments: [String]) {
        let options = Options(arguments, valued: [], boolean: [], usage: usage)
        guard options.positionals.count == 1, let mode = options.positionals.first, mode == "encode" || mode == "decode" else {
            fail("expected encode or decode", status: ExitStatus.usage, usage: usage)
        }
        let input = readAll(0)
        do {
            let output: [UInt8]
            if mode == "encode" {
                output = BinaryPlistEncoder.encode(try XMLPropertyList.parse(input))
            } else {
                output = Array(try XMLPropertyList.render(try BinaryPlistDecoder.decode(input)).utf8)
            }
            var offset = 0
            while offset < output.count {
                let n = output.withUnsafeBytes { write(1, $0.baseAddress! + offset, output.count - offset) }
                if n <= 0 { fail("plist \(mode): cannot write stdout") }
                offset += n
            }
        } catch let error as XMLPlistError {
            fail("plist encode: stdin: \(error)")
        } catch let error as XMLRenderError {
            fail("plist decode: stdin: cannot write as XML: \(error)")
        } catch {
            fail("plist decode: stdin (\(input.count) bytes): \(error)")
        }
    }

    static func readAll(_ fd: Int32) -> [UInt8] {
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = read(fd, &chunk, chunk.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return out }
            out += chunk[0..<n]
        }
    }
}
