// Building an embedded host for the CLI: where the bundled extensions are when sdk-host runs from a checkout.
import SDKHost

#if canImport(Glibc)
import Glibc
#endif

enum EmbeddedHost {
    /// The Extensions folder: $SDKHOST_EXTENSIONS, ./Extensions, or the checkout around the running binary
    /// (.build/<config>/sdk-host or .build/<triple>/<config>/sdk-host).
    static func extensionSearchPaths() -> [String] {
        if let env = getenv("SDKHOST_EXTENSIONS") { return String(cString: env).split(separator: ":").map(String.init) }
        var candidates = ["Extensions"]
        if let dir = currentExecutableDirectory() {
            candidates += ["\(dir)/../../Extensions", "\(dir)/../../../Extensions"]
        }
        return candidates.first { access("\($0)/Echo/Info.plist", R_OK) == 0 }.map { [$0] } ?? ["Extensions"]
    }

    static func make(logLevel: LogLevel = .warning, tweak: (inout HostConfiguration) -> Void = { _ in }) -> ExtensionHost {
        var configuration = HostConfiguration(extensionSearchPaths: extensionSearchPaths())
        configuration.logLevel = logLevel
        tweak(&configuration)
        do {
            return try ExtensionHost(configuration: configuration)
        } catch {
            fail("cannot start the embedded host: \(error)", status: 2)
        }
    }
}
