// Interop with two independent bplist implementations: Python's plistlib (committed fixtures, and a live
// python3 reading our output when python3 is installed) and Foundation's PropertyListSerialization in-process.
import Foundation
import Testing
import SDKWire
import SDKWireFoundation

let fixturesDirectory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures")
let fixtureNames = [
    "integers", "reals", "strings", "dates", "data", "bools", "empty_containers", "deep", "large_array", "shared",
    "message",
]

func fixture(_ name: String, _ ext: String) throws -> Data {
    try Data(contentsOf: fixturesDirectory.appendingPathComponent("\(name).\(ext)"))
}

/// The fixture's expected value, read from plistlib's XML by Foundation: independent of our decoder.
func expectedValue(_ name: String) throws -> PlistValue {
    try PlistFoundation.parse(try fixture(name, "xml"))
}

let python3Path = ["/usr/bin/python3", "/usr/local/bin/python3"].first { FileManager.default.isExecutableFile(atPath: $0) }
    ?? ProcessInfo.processInfo.environment["PATH"].flatMap { path in
        path.split(separator: ":").map { "\($0)/python3" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

@Suite struct InteropTests {
    @Test(arguments: fixtureNames)
    func decodesPlistlibOutput(_ name: String) throws {
        let ours = try BinaryPlistDecoder.decode(Array(try fixture(name, "bplist")), limits: WireLimits())
        #expect(ours == (try expectedValue(name)))
    }

    @Test(arguments: fixtureNames)
    func foundationReadsOurOutput(_ name: String) throws {
        let value = try expectedValue(name)
        let ours = Data(BinaryPlistEncoder.encode(value))
        let object = try PropertyListSerialization.propertyList(from: ours, options: [], format: nil)
        #expect(try PlistFoundation.value(from: object, path: name) == value)
    }

    @Test(arguments: fixtureNames)
    func decodesFoundationOutput(_ name: String) throws {
        let value = try expectedValue(name)
        let theirs = try PlistFoundation.render(value, format: .binary)
        #expect(try BinaryPlistDecoder.decode(Array(theirs)) == value)
    }

    @Test(.enabled(if: python3Path != nil, "python3 is not installed"))
    func pythonReadsOurOutput() throws {
        // Encode every fixture with our encoder, then let plistlib load each and compare with its own XML.
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("sdkwire-interop-\(getpid())")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        for name in fixtureNames {
            try Data(BinaryPlistEncoder.encode(try expectedValue(name)))
                .write(to: dir.appendingPathComponent("\(name).bplist"))
        }
        let script = """
            import plistlib, sys, math
            def same(a, b):
                if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b): return True
                return a == b
            bad = []
            for name in sys.argv[3:]:
                ours = plistlib.loads(open(f"{sys.argv[1]}/{name}.bplist", "rb").read())
                ref = plistlib.loads(open(f"{sys.argv[2]}/{name}.xml", "rb").read())
                if not same(ours, ref): bad.append(name)
            print("MISMATCH " + ",".join(bad) if bad else "ALL-EQUAL")
            """
        let process = Process()
        process.executableURL = URL(fileURLWithPath: python3Path!)
        process.arguments = ["-c", script, dir.path, fixturesDirectory.path] + fixtureNames
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        #expect(output.trimmingCharacters(in: .whitespacesAndNewlines) == "ALL-EQUAL")
    }

    @Test func sharedObjectsDecodeAtEveryReference() throws {
        // plistlib stores "same" once and refers to it from several containers.
        let value = try BinaryPlistDecoder.decode(Array(try fixture("shared", "bplist")))
        #expect(value["a"] == ["same", "same", 42, 42])
        #expect(value["c"]?["k"] == "same")
    }
}
