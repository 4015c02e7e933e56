// foundation-codec-bench: Foundation's PropertyListSerialization timed on a message given as bplist00 on fd 3
// (the channel sdk-host spawns it with);
// prints "<encode µs> <decode µs>". A separate executable so that sdk-host itself never links Foundation
// (its RSS is a target); `sdk-host bench` runs it from the same build folder for the comparison.
import Foundation
import SDKPosix

let iterations = CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 2000 : 2000
let payload = FileHandle(fileDescriptor: 3, closeOnDealloc: false).readDataToEndOfFile()
guard let object = try? PropertyListSerialization.propertyList(from: payload, options: [], format: nil) else {
    FileHandle.standardError.write(Data("foundation-codec-bench: fd 3 did not carry a property list\n".utf8))
    exit(1)
}
@inline(never) func blackHole<T>(_ value: T) { withExtendedLifetime(value) {} }
let encode = medianMicrosecondsPerCall(iterations) {
    blackHole(try! PropertyListSerialization.data(fromPropertyList: object, format: .binary, options: 0))
}
let decode = medianMicrosecondsPerCall(iterations) {
    blackHole(try! PropertyListSerialization.propertyList(from: payload, options: [], format: nil))
}
print("\(encode) \(decode)")
