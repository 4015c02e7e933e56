// swift-tools-version:6.0
// An extension package of its own, as a third party writes one: it depends on sdk-host only for the
// SDKExtension runtime and, in its tests, SDKExtensionTesting (by path here; by URL in a real project). It
// knows nothing of the host's sandbox.
import PackageDescription

let package = Package(
    name: "GreeterExtension",
    dependencies: [
        .package(name: "sdk-host", path: "../.."),  // in your own package: .package(url: "https://…/sdk-host.git", from: "…")
    ],
    targets: [
        // The handler and its helpers, in a library so that tests can import them.
        .target(name: "GreeterKit", dependencies: [.product(name: "SDKExtension", package: "sdk-host")]),
        // A well-behaved extension: the executable is only its @main.
        .executableTarget(name: "Greeter", dependencies: ["GreeterKit"]),
        // A "third-party SDK" that tries to get out, with nothing but Glibc calls.
        .executableTarget(name: "Snoop", dependencies: [.product(name: "SDKExtension", package: "sdk-host")]),
        // Two leaky ones, for the runtime's leak reports: one keeps every context, one a Task that never ends.
        .executableTarget(name: "Hoarder", dependencies: [.product(name: "SDKExtension", package: "sdk-host")]),
        .executableTarget(name: "Watcher", dependencies: [.product(name: "SDKExtension", package: "sdk-host")]),
        .testTarget(name: "GreeterKitTests", dependencies: [
            "GreeterKit", .product(name: "SDKExtensionTesting", package: "sdk-host"),
        ]),
    ]
)
