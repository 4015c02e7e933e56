// The limits a host configuration may hold, one rule each: the daemon's config file and a manifest are read by
// the parsers here and in ExtensionManifest.swift, and a HostConfiguration built in code is checked by running
// each of its values through the same parser (`validate()`), so that the API takes nothing the files refuse.
import SDKWire

extension HostConfiguration {
    /// Reads the config file's keys that set the host's own limits (the daemon's configuration reads the rest).
    package mutating func applyLimits(_ f: PlistFields) throws(HostError) {
        crashReportLimit = try f.integer("MaxCrashReports", in: 1...100_000) ?? crashReportLimit
        heartbeatIntervalSeconds = try f.seconds("HeartbeatIntervalSeconds", minimum: 0.05) ?? heartbeatIntervalSeconds
        heartbeatTimeoutSeconds = try f.seconds("HeartbeatTimeoutSeconds", minimum: 0.1) ?? heartbeatTimeoutSeconds
        cancelGracePeriodSeconds = try f.seconds("CancelGraceSeconds", minimum: 0) ?? cancelGracePeriodSeconds
        if let max = try f.integer("MaxFrameBytes", in: 1024...(1 << 30)) { wireLimits.maxFrameBytes = max }
        maxWorkersTotal = try f.integer("MaxWorkersTotal", in: 1...65_536) ?? maxWorkersTotal
        maxWorkersPerUID = try f.integer("MaxWorkersPerUID", in: 1...65_536) ?? maxWorkersPerUID
        maxAppPoolsPerUID = try f.integer("MaxAppPoolsPerUID", in: 1...65_536) ?? maxAppPoolsPerUID
        maxQueuedRequests = try f.integer("MaxQueuedRequests", in: 0...10_000_000) ?? maxQueuedRequests
        busyPollMicroseconds = try f.integer("BusyPollMicroseconds", in: Self.busyPollMicrosecondsRange) ?? busyPollMicroseconds
        maxMemoryLimitMB = try f.integer("MaxMemoryLimitMB", in: 16...65536) ?? maxMemoryLimitMB
    }

    /// The keys `applyLimits` reads, each with the property it sets and that property's value here.
    private var limitFields: [(property: String, key: String, value: PlistValue)] {
        var fields: [(String, String, PlistValue)] = [
            ("crashReportLimit", "MaxCrashReports", .integer(Int64(crashReportLimit))),
            ("heartbeatInterval", "HeartbeatIntervalSeconds", .real(heartbeatIntervalSeconds)),
            ("heartbeatTimeout", "HeartbeatTimeoutSeconds", .real(heartbeatTimeoutSeconds)),
            ("cancelGracePeriod", "CancelGraceSeconds", .real(cancelGracePeriodSeconds)),
            ("wireLimits.maxFrameBytes", "MaxFrameBytes", .integer(Int64(wireLimits.maxFrameBytes))),
            ("maxWorkersTotal", "MaxWorkersTotal", .integer(Int64(maxWorkersTotal))),
            ("maxWorkersPerUID", "MaxWorkersPerUID", .integer(Int64(maxWorkersPerUID))),
            ("maxAppPoolsPerUID", "MaxAppPoolsPerUID", .integer(Int64(maxAppPoolsPerUID))),
            ("maxQueuedRequests", "MaxQueuedRequests", .integer(Int64(maxQueuedRequests))),
            ("busyPollMicroseconds", "BusyPollMicroseconds", .integer(Int64(busyPollMicroseconds))),
        ]
        if let max = maxMemoryLimitMB { fields.append(("maxMemoryLimitMB", "MaxMemoryLimitMB", .integer(Int64(max)))) }
        return fields
    }

    /// Throws `invalidConfiguration` for a value the config file (or, in `defaultPolicy`, a manifest) would
    /// refuse, naming the property and its key: "HostConfiguration.defaultPolicy.maxWorkers: MaxWorkers: 0 is
    /// outside 1...64". A heartbeat of zero, a negative deadline or a frame limit of ten bytes is refused before
    /// the host starts, not met later as a trap or a host that ends every request.
    package func validate() throws(HostError) {
        for field in limitFields {
            var scratch = self
            try scratch.applyLimits(PlistFields(checking: field.key, field.value, as: "HostConfiguration.\(field.property)"))
        }
        // Not a key of the file (a host built in code sets it), under the rule of every other number of seconds.
        _ = try PlistFields(checking: "seconds", .real(workerExitGracePeriodSeconds), as: "HostConfiguration.workerExitGracePeriod")
            .seconds("seconds", minimum: 0)
        try defaultPolicy.validate(as: "HostConfiguration.defaultPolicy")
        // The folders every root holds, under the config file's rule for them (no "..", not the whole file system).
        _ = try ExtensionPolicy.grants(PlistFields(checking: "RuntimePaths", .array(runtimePaths.map { .string($0) }),
                                                   as: "HostConfiguration.runtimePaths"), "RuntimePaths", needing: "every worker")
        for (interpreter, folders) in interpreters.sorted(by: { $0.key < $1.key }) {
            guard ExtensionPolicy.isAbsoluteWithoutDotDot(interpreter) else {
                throw HostError(.invalidConfiguration, "HostConfiguration.interpreters: '\(interpreter)' is not an absolute path without '..'")
            }
            _ = try ExtensionPolicy.grants(PlistFields(checking: interpreter, .array(folders.map { .string($0) }),
                                                       as: "HostConfiguration.interpreters"), interpreter, needing: "the interpreter")
        }
    }
}

extension ExtensionPolicy {
    /// Throws `invalidConfiguration` for a value its manifest key would refuse (`HostConfiguration.validate()`).
    package func validate(as name: String) throws(HostError) {
        for field in manifestFields {
            var scratch = ExtensionPolicy()
            var entries = [field.key: field.value]
            // MinWarmWorkers is checked against MaxWorkers.
            if field.key == "MinWarmWorkers" { entries["MaxWorkers"] = .integer(Int64(maxWorkers)) }
            let fields = try PlistFields(.dictionary(entries), file: "\(name).\(field.property)", errorCode: .invalidConfiguration)
            try scratch.apply(fields)
        }
    }

    /// Each property a manifest can set, with its key and its value here (those left nil, none).
    private var manifestFields: [(property: String, key: String, value: PlistValue)] {
        func integer(_ n: Int) -> PlistValue { .integer(Int64(n)) }
        var fields: [(String, String, PlistValue)] = [
            ("maxConcurrentRequests", "MaxConcurrentRequests", integer(maxConcurrentRequests)),
            ("maxWorkers", "MaxWorkers", integer(maxWorkers)),
            ("idleTimeout", "IdleTimeoutSeconds", .real(idleTimeoutSeconds)),
            ("readablePaths", "ReadablePaths", .array(readablePaths.map { .string($0) })),
            ("writablePaths", "WritablePaths", .array(writablePaths.map { .string($0) })),
            ("restartLimitBurst", "RestartLimitBurst", integer(restartLimitBurst)),
            ("restartLimitInterval", "RestartLimitIntervalSeconds", .real(restartLimitIntervalSeconds)),
            ("firstQuarantine", "QuarantineSeconds", .real(quarantineSeconds)),
            ("minWarmWorkers", "MinWarmWorkers", integer(minWarmWorkers)),
            ("environment", "Environment", .dictionary(environment.mapValues { .string($0) })),
            ("tempSizeMB", "TempSizeMB", integer(tempSizeMB)),
            ("maxThreads", "MaxThreads", integer(maxThreads)),
            ("leakCheckDelay", "LeakCheckDelaySeconds", .real(leakCheckDelaySeconds)),
            ("hostServices", "HostServices", .array(hostServices.sorted().map { .string($0) })),
            ("maxHostCallsInFlight", "MaxHostCallsInFlight", integer(maxHostCallsInFlight)),
        ]
        // The manifest gives it in whole milliseconds: a fraction counts as the next one up (0.4 ms is a threshold
        // of a positive length, as 1 ms is, not 0), and a value that is not a finite number reads as 0 ms.
        let milliseconds = slowRequestThresholdSeconds * 1000
        fields.append(("slowRequestThreshold", "SlowRequestThresholdMilliseconds",
                       .integer(milliseconds.isFinite ? Int64(max(-1e15, min(1e15, milliseconds)).rounded(.up)) : 0)))
        if let deadline = requestDeadlineSeconds { fields.append(("requestDeadline", "RequestDeadlineSeconds", .real(deadline))) }
        if let memory = memoryLimitMB { fields.append(("memoryLimitMB", "MemoryLimitMB", integer(memory))) }
        if let n = maxRequestsPerWorker { fields.append(("maxRequestsPerWorker", "MaxRequestsPerWorker", integer(n))) }
        if let rss = maxWorkerRSSMB { fields.append(("maxWorkerRSSMB", "MaxWorkerRSSMB", integer(rss))) }
        if let digest = executableSHA256 { fields.append(("executableSHA256", "ExecutableSHA256", .string(digest))) }
        return fields
    }
}

extension PlistFields {
    /// One key and its value, for a check whose errors read "<name>: <key>: <problem>".
    init(checking key: String, _ value: PlistValue, as name: String) throws(HostError) {
        try self.init(.dictionary([key: value]), file: name, errorCode: .invalidConfiguration)
    }
}
