// A HostConfiguration built in code takes nothing the daemon's config file or a manifest would refuse: each
// value goes through the same parser, and the error names the property and its key.
import SDKHost
import SDKWire
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct ConfigurationChecksTests {
    /// The error `ExtensionHost(configuration:)` throws for the configuration `change` makes, or nil if it starts.
    func refusal(_ change: (inout HostConfiguration) -> Void) async -> HostError? {
        var template = "/tmp/sdkhost-checks-XXXXXX".utf8CString
        let folder = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        defer { rmdir(folder) }
        var configuration = HostConfiguration(extensionSearchPaths: [folder])
        change(&configuration)
        do {
            let host = try ExtensionHost(configuration: configuration)
            await host.shutdown()
            return nil
        } catch {
            return error
        }
    }

    @Test func theDefaultsAndTheFilesBoundsStart() async {
        #expect(await refusal { _ in } == nil)
        let bounds = await refusal {
            $0.heartbeatInterval = .milliseconds(50)
            $0.heartbeatTimeout = .milliseconds(100)
            $0.cancelGracePeriod = .zero
            $0.wireLimits.maxFrameBytes = 1024
            $0.maxQueuedRequests = 0
            $0.defaultPolicy.maxWorkers = 64
            $0.defaultPolicy.minWarmWorkers = 64
            $0.defaultPolicy.requestDeadline = nil
            $0.defaultPolicy.memoryLimitMB = nil
            $0.defaultPolicy.leakCheckDelay = .zero
            $0.defaultPolicy.slowRequestThreshold = .milliseconds(1)
        }
        #expect(bounds == nil, "\(String(describing: bounds))")
        // A threshold under a millisecond is one the file cannot write, not a zero: it counts as 1 ms.
        let fraction = await refusal { $0.defaultPolicy.slowRequestThreshold = .microseconds(400) }
        #expect(fraction == nil, "\(String(describing: fraction))")
    }

    @Test func eachValueTheFilesRefuseIsRefusedNamingThePropertyAndKey() async {
        let cases: [(String, (inout HostConfiguration) -> Void)] = [
            ("HostConfiguration.heartbeatInterval: HeartbeatIntervalSeconds: 0.0 must be at least 0.05", { $0.heartbeatInterval = .zero }),
            ("HostConfiguration.heartbeatTimeout: HeartbeatTimeoutSeconds: -1.0 must be at least 0.1", { $0.heartbeatTimeout = .seconds(-1) }),
            ("HostConfiguration.cancelGracePeriod: CancelGraceSeconds: ", { $0.cancelGracePeriod = .seconds(1e12) }),
            ("HostConfiguration.wireLimits.maxFrameBytes: MaxFrameBytes: 10 is outside 1024...1073741824", { $0.wireLimits.maxFrameBytes = 10 }),
            ("HostConfiguration.maxWorkersTotal: MaxWorkersTotal: 0 is outside 1...65536", { $0.maxWorkersTotal = 0 }),
            ("HostConfiguration.maxQueuedRequests: MaxQueuedRequests: -1 is outside 0...10000000", { $0.maxQueuedRequests = -1 }),
            ("HostConfiguration.crashReportLimit: MaxCrashReports: 0 is outside 1...100000", { $0.crashReportLimit = 0 }),
            ("HostConfiguration.busyPollMicroseconds: BusyPollMicroseconds: 5000 is outside 0...1000", { $0.busyPollMicroseconds = 5000 }),
            ("HostConfiguration.maxMemoryLimitMB: MaxMemoryLimitMB: 1 is outside 16...65536", { $0.maxMemoryLimitMB = 1 }),
            ("HostConfiguration.workerExitGracePeriod: seconds: -2.0 must be at least 0", { $0.workerExitGracePeriod = .seconds(-2) }),
            ("HostConfiguration.defaultPolicy.maxWorkers: MaxWorkers: 0 is outside 1...64", { $0.defaultPolicy.maxWorkers = 0 }),
            ("HostConfiguration.defaultPolicy.maxConcurrentRequests: MaxConcurrentRequests: 0 is outside 1...1024",
             { $0.defaultPolicy.maxConcurrentRequests = 0 }),
            ("HostConfiguration.defaultPolicy.idleTimeout: IdleTimeoutSeconds: 0.0 must be at least 0.1", { $0.defaultPolicy.idleTimeout = .zero }),
            ("HostConfiguration.defaultPolicy.requestDeadline: RequestDeadlineSeconds: -5.0 must be at least 0.01",
             { $0.defaultPolicy.requestDeadline = .seconds(-5) }),
            ("HostConfiguration.defaultPolicy.memoryLimitMB: MemoryLimitMB: 0 is outside 16...65536", { $0.defaultPolicy.memoryLimitMB = 0 }),
            ("HostConfiguration.defaultPolicy.maxThreads: MaxThreads: 1 is outside 4...32768", { $0.defaultPolicy.maxThreads = 1 }),
            ("HostConfiguration.defaultPolicy.tempSizeMB: TempSizeMB: 0 is outside 1...65536", { $0.defaultPolicy.tempSizeMB = 0 }),
            ("HostConfiguration.defaultPolicy.minWarmWorkers: MinWarmWorkers: 3 is more than MaxWorkers (2)", { $0.defaultPolicy.minWarmWorkers = 3 }),
            ("HostConfiguration.defaultPolicy.firstQuarantine: QuarantineSeconds: at most 300", { $0.defaultPolicy.firstQuarantine = .seconds(301) }),
            ("HostConfiguration.defaultPolicy.slowRequestThreshold: SlowRequestThresholdMilliseconds: 0 is outside 1...3600000",
             { $0.defaultPolicy.slowRequestThreshold = .zero }),
            ("HostConfiguration.defaultPolicy.readablePaths: ReadablePaths: ", { $0.defaultPolicy.readablePaths = ["relative/path"] }),
            ("HostConfiguration.defaultPolicy.environment: Environment.SDKHOST_SOCKET: SDKHOST_ names are reserved", { $0.defaultPolicy.environment = ["SDKHOST_SOCKET": "x"] }),
            ("HostConfiguration.defaultPolicy.hostServices: HostServices: 'no spaces' is not a service name",
             { $0.defaultPolicy.hostServices = ["no spaces"] }),
            ("HostConfiguration.defaultPolicy.executableSHA256: ExecutableSHA256: 'abc' is not 64 hex digits",
             { $0.defaultPolicy.executableSHA256 = "abc" }),
            ("HostConfiguration.defaultPolicy.maxRequestsPerWorker: MaxRequestsPerWorker: 0 is outside", { $0.defaultPolicy.maxRequestsPerWorker = 0 }),
            ("HostConfiguration.runtimePaths: RuntimePaths: '/' is the whole file system; name the folders every worker needs",
             { $0.runtimePaths.append("/") }),
            ("HostConfiguration.runtimePaths: RuntimePaths: 'lib' is not an absolute path", { $0.runtimePaths = ["lib"] }),
            ("HostConfiguration.interpreters: /usr/bin/python3: '/.' is the whole file system; name the folders the interpreter needs",
             { $0.interpreters = ["/usr/bin/python3": ["/usr/lib", "/."]] }),
            ("HostConfiguration.interpreters: 'python3' is not an absolute path without '..'", { $0.interpreters = ["python3": ["/usr/lib"]] }),
        ]
        for (expected, change) in cases {
            let error = await refusal(change)
            #expect(error?.code == .invalidConfiguration, "\(expected): \(String(describing: error))")
            #expect(error?.detail.hasPrefix(expected) == true, "\(String(describing: error?.detail)) (wanted \(expected)…)")
        }
    }
}
