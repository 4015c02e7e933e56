// swift-tools-version:6.2
// sdk-host: an out-of-process extension host for Linux. No package dependencies by design (shared/DESIGN.md).
import PackageDescription

/// Extension executables and sdk-host are fully static executables (shared/DESIGN.md: spawn cost and daemon RSS
/// are targets): no dynamic loader work at exec, only the pages actually touched are resident. lld links them:
/// unlike GNU ld it does not print glibc's static-dlopen notice (the Swift runtime's optional dlopen just fails).
let staticExecutable: [LinkerSetting] = [.unsafeFlags(["-static-executable", "-use-ld=lld"])]

/// The bundled extensions are linked with the code a worker runs laid out first (`Extensions/hot-text.order`,
/// made by `bench/order-file/generate.sh`). A worker maps its executable's text through the kernel's
/// fault-around, 64 KiB around each page it touches, and a killed worker's teardown unmaps every page mapped:
/// with the hot code scattered over the whole text, that was ~3.4 MB of 5.3 MB and about a third of the time from
/// SIGKILL to the worker's death being seen (docs/BENCHMARKS.md). Names an executable does not define are skipped,
/// so a stale file only costs layout, never the build.
let packageDirectory = String(#filePath.dropLast("/Package.swift".count))
let extensionExecutable: [LinkerSetting] = [
    .unsafeFlags([
        "-static-executable", "-use-ld=lld",
        "-Xlinker", "--symbol-ordering-file=\(packageDirectory)/Extensions/hot-text.order",
        "-Xlinker", "--no-warn-symbol-ordering",
    ])
]

let package = Package(
    name: "sdk-host",
    products: [
        .library(name: "SDKHost", targets: ["SDKHost"]),
        .library(name: "SDKExtension", targets: ["SDKExtension"]),
        // For extension authors' tests: a leak assertion (Swift Testing and XCTest) and an in-process harness.
        .library(name: "SDKExtensionTesting", targets: ["SDKExtensionTesting"]),
        .executable(name: "sdk-host", targets: ["sdk-host"]),
        // The sandbox launcher every worker is spawned through. An app that embeds the host depends on this
        // product too, so that `swift build` puts it next to the app's executable, where the host looks for it.
        .executable(name: "sdk-host-launcher", targets: ["sdk-host-launcher"]),
        // The engine's deterministic simulation (shared/DESIGN.md "The engine").
        .executable(name: "sdk-host-simulate", targets: ["sdk-host-simulate"]),
    ],
    targets: [
        // Wire codec: property-list values, bplist00, frames, and descriptor attachments (which need the shim's
        // memfd and copy calls).
        .target(name: "SDKWire", dependencies: ["CSDKShim"]),
        // Linux calls Swift cannot make directly: posix_spawn setup, variadic prctl/syscall, packed epoll_event.
        .target(name: "CSDKShim"),
        // POSIX layer: owned descriptors, sockets, spawn/reap via pidfd, the epoll event loop.
        .target(name: "SDKPosix", dependencies: ["CSDKShim"]),
        // Bridge to Foundation property lists, for the interop tests only.
        .target(name: "SDKWireFoundation", dependencies: ["SDKWire"]),
        // Public host API (embedded mode for now).
        .target(name: "SDKHost", dependencies: ["SDKWire", "SDKPosix", "CSDKShim"]),
        // Worker-side runtime that extension executables link.
        .target(name: "SDKExtension", dependencies: ["SDKWire", "SDKPosix", "CSDKShim"]),
        // Testing an extension's handlers in process, and anything's object graph for leaks.
        .target(name: "SDKExtensionTesting", dependencies: ["SDKExtension"]),
        // Bundled extensions: one executable target per Extensions/<Name>, each with an Info.plist manifest.
        // They link the Swift stdlib statically: fewer shared objects to map and relocate at every spawn.
        .executableTarget(
            name: "Echo", dependencies: ["SDKExtension"], path: "Extensions/Echo", exclude: ["Info.plist"],
            linkerSettings: extensionExecutable),
        .executableTarget(
            name: "Crasher", dependencies: ["SDKExtension", "SDKWire", "CSDKShim"], path: "Extensions/Crasher", exclude: ["Info.plist"],
            linkerSettings: extensionExecutable),
        .executableTarget(
            name: "AsyncEcho", dependencies: ["SDKExtension"], path: "Extensions/AsyncEcho", exclude: ["Info.plist"],
            linkerSettings: extensionExecutable),
        .executableTarget(
            name: "Ticker", dependencies: ["SDKExtension"], path: "Extensions/Ticker", exclude: ["Info.plist"],
            linkerSettings: extensionExecutable),
        .executableTarget(
            name: "Renderer", dependencies: ["SDKExtension"], path: "Extensions/Renderer", exclude: ["Info.plist"],
            linkerSettings: extensionExecutable),
        // The C worker runtime (docs/C-RUNTIME.md): one header and one source file, C11 and libc only, built here
        // for the C Crasher; an extension in another build compiles the two files itself.
        .target(
            name: "SDKHostC", path: "Extensions/CRuntime",
            cSettings: [.unsafeFlags(["-std=c11", "-Wall", "-Wextra", "-Wpedantic"])]),
        // com.example.crasher-c: the Crasher's faults on the C runtime, with the same outcomes.
        .executableTarget(
            name: "CrasherC", dependencies: ["SDKHostC"], path: "Extensions/CrasherC", exclude: ["Info.plist", "test_runtime.py"],
            cSettings: [.unsafeFlags(["-std=c11", "-Wall", "-Wextra", "-Wpedantic"])]),
        // Tries every sandbox escape (Extensions/Escaper). Linked the ordinary way, dynamically against the
        // toolchain's Swift runtime, as an extension in another package would be.
        .executableTarget(
            name: "Escaper", dependencies: ["SDKExtension", "EscaperProbes"], path: "Extensions/Escaper",
            exclude: ["Info.plist"]),
        // The raw system calls Escaper tries (Swift cannot call the variadic syscall(2)).
        .target(name: "EscaperProbes", path: "Extensions/EscaperProbes"),
        // Spawned in each worker's place: applies the sandbox profile, then execs the extension. C, statically
        // linked, and without glibc (its own runtime.c): it runs at every spawn, every layer is a system call
        // (README "Sandbox"), and glibc's start-up alone cost ~0.3 ms of each cold start on a VM.
        .executableTarget(
            name: "sdk-host-launcher", path: "Sources/sdk-host-launcher",
            cSettings: [.unsafeFlags(["-O2", "-fno-stack-protector", "-fno-builtin"])],
            linkerSettings: [.unsafeFlags(["-static-executable", "-use-ld=lld", "-Xclang-linker", "-nostdlib"])]),
        // The engine's seeded simulation: fake workers and schedules on one thread (`sdk-host-simulate`, and a
        // short run in the suite).
        .target(name: "SDKSimulation", dependencies: ["SDKWire", "SDKHost", "SDKDaemon", "SDKPosix", "CSDKShim"]),
        .executableTarget(name: "sdk-host-simulate", dependencies: ["SDKSimulation", "SDKHost", "SDKPosix", "CSDKShim"], linkerSettings: staticExecutable),
        // The daemon: the engine behind a Unix socket, its configuration file.
        .target(name: "SDKDaemon", dependencies: ["SDKWire", "SDKHost", "SDKPosix", "CSDKShim"]),
        // The CLI and daemon. No Foundation (daemon RSS is a target) and a static stdlib (spawn and RSS).
        .executableTarget(
            name: "sdk-host",
            // Depending on the extensions and the Foundation codec helper makes `swift run sdk-host …` build them
            // next to it.
            dependencies: ["SDKWire", "SDKPosix", "SDKHost", "SDKDaemon", "CSDKShim", "Echo", "Crasher", "AsyncEcho", "Ticker", "Renderer", "Escaper", "CrasherC", "foundation-codec-bench", "sdk-host-launcher"],
            linkerSettings: staticExecutable),
        // Times Foundation's PropertyListSerialization for `sdk-host bench`, in its own process.
        .executableTarget(name: "foundation-codec-bench", dependencies: ["SDKPosix"]),
        .testTarget(
            name: "SDKWireTests",
            dependencies: ["SDKWire", "SDKWireFoundation", "HostTestSupport", "CSDKShim"],
            exclude: ["Fixtures"]
        ),
        // Helpers shared by the host and fault tests (hosts, recorders, leak snapshots).
        .target(name: "HostTestSupport", dependencies: ["SDKWire", "SDKHost", "SDKPosix", "SDKSimulation"], path: "Tests/HostTestSupport"),
        .testTarget(name: "SDKPosixTests", dependencies: ["SDKPosix", "HostTestSupport"]),
        .testTarget(name: "SDKExtensionTests", dependencies: ["SDKWire", "SDKExtension"]),
        .testTarget(name: "SDKExtensionTestingTests", dependencies: ["SDKWire", "SDKExtensionTesting", "SDKHost", "HostTestSupport"]),
        .testTarget(name: "SDKHostTests", dependencies: ["SDKWire", "SDKHost", "SDKPosix", "CSDKShim", "HostTestSupport", "SDKSimulation"]),
        .testTarget(name: "DaemonTests", dependencies: ["SDKWire", "SDKDaemon", "SDKHost", "SDKPosix", "HostTestSupport"]),
        // Crash and fault injection, in its own target so it can run alone: swift test --filter FaultTests
        .testTarget(name: "FaultTests", dependencies: ["SDKWire", "SDKHost", "SDKPosix", "CSDKShim", "HostTestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
