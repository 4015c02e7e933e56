// swift-tools-version:6.0
// An app package of its own that embeds the host: it depends on sdk-host for the SDKHost library and for the
// sandbox launcher, which `swift build` then puts next to the app's executable, where the host looks for it.
import PackageDescription

let package = Package(
    name: "GreeterApp",
    dependencies: [
        .package(name: "sdk-host", path: "../.."),  // in your own package: .package(url: "https://…/sdk-host.git", from: "…")
    ],
    targets: [
        .executableTarget(
            name: "greeter-app",
            dependencies: [
                .product(name: "SDKHost", package: "sdk-host"),
                .product(name: "sdk-host-launcher", package: "sdk-host"),
            ]),
    ]
)
