// swift-tools-version:6.0
// An extension package of its own, as a third party writes one: it depends on sdk-host only for the
// SDKExtension runtime (by path here; by URL in a real project) and knows nothing of the host's sandbox.
import PackageDescription

let package = Package(
    name: "GreeterExtension",
    dependencies: [
        .package(name: "sdk-host", path: "../.."),  // in your own package: .package(url: "https://…/sdk-host.git", from: "…")
    ],
    targets: [
        // A well-behaved extension.
        .executableTarget(name: "Greeter", dependencies: [.product(name: "SDKExtension", package: "sdk-host")]),
        // A "third-party SDK" that tries to get out, with nothing but Glibc calls.
        .executableTarget(name: "Snoop", dependencies: [.product(name: "SDKExtension", package: "sdk-host")]),
    ]
)
