// docs/PROTOCOL.md cannot drift from the code: every worked example in it is decoded by the host's codec and by
// Python's plistlib, must be the message it says and a valid message of its type, and must be as long as the
// host's encoder writes it; the byte-by-byte walk through a frame must be the `ping` example's bytes.
import Foundation
import Testing
import SDKWire

let protocolDocument = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .appendingPathComponent("../../docs/PROTOCOL.md").standardizedFileURL

/// One ```frame block: its name, the message as JSON, and the frame's bytes.
struct DocumentedFrame: CustomStringConvertible {
    let name: String
    let json: String
    let bytes: [UInt8]
    var description: String { name }
}

func documentText() throws -> String { try String(contentsOf: protocolDocument, encoding: .utf8) }

/// The hex pairs at the start of `line`, up to its first word that is not one.
func leadingHex(_ line: Substring) -> [UInt8] {
    var out: [UInt8] = []
    for word in line.split(separator: " ") {
        guard word.count == 2, let byte = UInt8(word, radix: 16) else { break }
        out.append(byte)
    }
    return out
}

func documentedFrames() throws -> [DocumentedFrame] {
    let lines = try documentText().split(separator: "\n", omittingEmptySubsequences: false)
    var frames: [DocumentedFrame] = []
    var index = 0
    while index < lines.count {
        defer { index += 1 }
        guard lines[index].hasPrefix("```frame ") else { continue }
        let name = String(lines[index].dropFirst("```frame ".count))
        index += 1
        guard index < lines.count, lines[index].hasPrefix("message: ") else { continue }
        let json = String(lines[index].dropFirst("message: ".count))
        var bytes: [UInt8] = []
        index += 1
        while index < lines.count, !lines[index].hasPrefix("```") {
            bytes += leadingHex(lines[index])
            index += 1
        }
        frames.append(DocumentedFrame(name: name, json: json, bytes: bytes))
    }
    return frames
}

/// A JSON value (strings, integers, arrays, objects) as a property-list value.
func plistValue(json: Any) throws -> PlistValue {
    switch json {
    case let s as String: return .string(s)
    case let n as NSNumber: return .integer(n.int64Value)
    case let a as [Any]: return .array(try a.map(plistValue(json:)))
    case let d as [String: Any]: return .dictionary(try d.mapValues(plistValue(json:)))
    default: throw MessageError("unexpected JSON value \(json)")
    }
}

@Suite struct ProtocolDocumentTests {
    @Test func theDocumentHasItsExamples() throws {
        let names = try documentedFrames().map(\.name)
        for needed in ["hello", "welcome", "ping", "pong", "begin", "complete", "begin-with-file", "partial", "credit",
                       "cancel", "cancelled", "hostCall", "hostCallResult"] {
            #expect(names.contains(needed), "docs/PROTOCOL.md has no '\(needed)' example")
        }
    }

    @Test(arguments: try documentedFrames())
    func anExampleIsWhatTheCodecReadsAndWrites(_ frame: DocumentedFrame) throws {
        let expected = try plistValue(json: try JSONSerialization.jsonObject(with: Data(frame.json.utf8)))
        #expect(frame.bytes.count > 4)
        let length = frame.bytes.prefix(4).reduce(0) { $0 << 8 | Int($1) }
        let payload = Array(frame.bytes.dropFirst(4))
        #expect(length == payload.count, "\(frame.name): the header says \(length) bytes, \(payload.count) follow")
        let decoded = try BinaryPlistDecoder.decode(payload)
        #expect(decoded == expected, "\(frame.name): the bytes decode to \(decoded)")
        // A valid message of the type it names, with its descriptors when it says it has some.
        let files = try (0..<Message.descriptorCount(of: decoded)).map { _ in
            try FileAttachment(bytes: [1], name: "protocol-document")
        }
        let message = try Message(plist: decoded, files: files)
        #expect(message.typeName == decoded["type"]?.stringValue)
        #expect(BinaryPlistEncoder.encode(expected).count == payload.count,
                "\(frame.name): the host's encoder writes this message in another number of bytes")
        // And with the frame encoder, header included.
        #expect(try Frame.encode(expected).count == frame.bytes.count)
    }

    @Test func plistlibReadsEveryExample() throws {
        guard let python3Path else { return }
        for frame in try documentedFrames() {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: python3Path)
            process.arguments = ["-c", "import sys, plistlib, json; b = sys.stdin.buffer.read(); "
                + "assert int.from_bytes(b[:4], 'big') == len(b) - 4; print(json.dumps(plistlib.loads(b[4:]), sort_keys=True))"]
            let input = Pipe(), output = Pipe()
            process.standardInput = input
            process.standardOutput = output
            try process.run()
            input.fileHandleForWriting.write(Data(frame.bytes))
            try input.fileHandleForWriting.close()
            let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            #expect(process.terminationStatus == 0, "\(frame.name): plistlib could not read it")
            let ours = try JSONSerialization.jsonObject(with: Data(frame.json.utf8)) as? NSDictionary
            let theirs = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? NSDictionary
            #expect(ours == theirs, "\(frame.name): plistlib reads \(text)")
        }
    }

    @Test func theByteByByteWalkIsThePingExample() throws {
        let text = try documentText()
        let section = try #require(text.range(of: "### A frame, byte by byte"))
        let block = text[section.upperBound...]
        let start = try #require(block.range(of: "```\n"))
        let end = try #require(block[start.upperBound...].range(of: "```"))
        let walked = block[start.upperBound..<end.lowerBound].split(separator: "\n").flatMap(leadingHex)
        let ping = try #require(try documentedFrames().first { $0.name == "ping" })
        #expect(walked == ping.bytes)
        #expect(try BinaryPlistDecoder.decode(Array(walked.dropFirst(4))) == .fields([.type: .string("ping"), .seq: .integer(7)]))
    }
}
