// swift-tools-version:6.2
// sdk-host: an out-of-process extension host for Linux. No package dependencies by design (shared/DESIGN.md).
import PackageDescription

let package = Package(
    name: "sdk-host",
    products: [
        .library(name: "SDKHost", targets: ["SDKHost"]),
        .library(name: "SDKExtension", targets: ["SDKExtension"]),
        .executable(name: "sdk-host", targets: ["sdk-host"]),
    ],
    targets: [
        // Wire codec: property-list values, bplist00, frames. Depends on nothing but the stdlib.
        .target(name: "SDKWire"),
        // Bridge to Foundation property lists, for the CLI's XML conversion and the interop tests only.
        .target(name: "SDKWireFoundation", dependencies: ["SDKWire"]),
        // Public host API (embedded mode for now).
        .target(name: "SDKHost", dependencies: ["SDKWire"]),
        // Worker-side runtime that extension executables link.
        .target(name: "SDKExtension", dependencies: ["SDKWire"]),
        // The CLI and daemon. Foundation is allowed here, off the hot path (XML plist conversion).
        .executableTarget(name: "sdk-host", dependencies: ["SDKWire", "SDKWireFoundation", "SDKHost"]),
        .testTarget(
            name: "SDKWireTests",
            dependencies: ["SDKWire", "SDKWireFoundation"],
            exclude: ["Fixtures"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
