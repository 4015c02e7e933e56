// `sdk-host plist encode|decode`: convert between XML property lists and our wire payloads, to inspect
// captured messages or craft test input.
import Foundation
import SDKWire
import SDKWireFoundation

enum PlistCommand {
    static func run(_ arguments: [String]) {
        guard arguments.count == 1, let mode = arguments.first, mode == "encode" || mode == "decode" else {
            fail("usage: sdk-host plist encode|decode  (input on stdin, output on stdout)", status: 2)
        }
        let input = FileHandle.standardInput.readDataToEndOfFile()
        do {
            let output: Data
            if mode == "encode" {
                output = Data(BinaryPlistEncoder.encode(try PlistFoundation.parse(input)))
            } else {
                let value = try Array(input).withUnsafeBytes { raw in try BinaryPlistDecoder.decode(raw) }
                output = try PlistFoundation.render(value)
            }
            FileHandle.standardOutput.write(output)
        } catch let error as WireError {
            fail("plist decode: stdin (\(input.count) bytes): \(error)")
        } catch {
            fail("plist \(mode): stdin: \(error)")
        }
    }
}
