// What a process running schedules sets up once and shares between them (`SimulationWorld`): the manifest
// every schedule's engine serves, the inputs its engines start with, the memfds the begins' files are made of,
// and the descriptor count one schedule hands the next; and the process's own descriptor listing, which the
// schedules' leak check reads.
import SDKHost
import Dispatch

#if canImport(Glibc)
import Glibc
#endif

/// The extension every schedule runs: a manifest in a folder of its own whose executable is the simulating
/// program (never run: SimLauncher stands in for posix_spawn).
package struct SimulationWorld {
    package static let identifier = "com.example.sim"
    package let root: String
    let executableDirectory: String
    /// The user, launcher and manifest every schedule's engine starts with, read once (the files do not change).
    private(set) var startInputs: EngineStartInputs?
    /// The files the app's and the clients' begins bring, one memfd each for every schedule (`remove()` closes
    /// them): open before a schedule counts its descriptors, and every descriptor of them a schedule makes is its
    /// own to close.
    let appFiles = SimFiles(bytes: SimFiles.appBytes), clientFiles = SimFiles(bytes: SimFiles.clientBytes)
    /// How many descriptors the process had open when the last schedule ended cleanly: the next one's count before.
    let descriptorBaseline = DescriptorBaseline()

    /// Writes the manifest under a new folder in `temporaryDirectory`.
    package init(executable: String, temporaryDirectory: String = "/tmp") throws(HostError) {
        var template = "\(temporaryDirectory)/sdkhost-sim-XXXXXX".utf8CString
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw HostError(.system, "cannot make a folder in \(temporaryDirectory)")
        }
        root = String(cString: made)
        let slash = executable.lastIndex(of: "/") ?? executable.startIndex
        executableDirectory = String(executable[..<slash])
        let name = String(executable[executable.index(after: slash)...])
        mkdir("\(root)/Sim", 0o755)
        let xml = """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict>
              <key>CFBundleIdentifier</key><string>\(Self.identifier)</string>
              <key>NSExtension</key><dict>
                <key>NSExtensionPointIdentifier</key><string>com.sdk-host.service</string>
                <key>NSExtensionExecutable</key><string>\(name)</string>
                <key>SDKHostPolicy</key><dict>
                  <key>Sandbox</key><string>none</string>
                  <key>MaxWorkers</key><integer>2</integer>
                  <key>MaxConcurrentRequests</key><integer>2</integer>
                  <key>IdleTimeoutSeconds</key><real>4</real>
                  <key>MaxRequestsPerWorker</key><integer>5</integer>
                </dict>
              </dict>
            </dict></plist>
            """
        do {
            try writeFile("\(root)/Sim/Info.plist", Array(xml.utf8), mode: 0o644)
        } catch {
            throw HostError(.system, "cannot write the simulation's manifest: \(error)")
        }
        startInputs = try EngineStartInputs.read(hostConfiguration())
        appFiles.prepare()
        clientFiles.prepare()
        // Dispatch opens its own epoll and eventfd the first time work goes to a global queue (an engine's start
        // does): open them now, or the first schedule counts them as its leak.
        // Its timerfd opens the first time a timer is set: set one too.
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global(qos: .utility).async { done.signal() }
        done.wait()
        DispatchQueue.global(qos: .utility).asyncAfter(deadline: .now() + .milliseconds(1)) { done.signal() }
        done.wait()
    }

    /// Runs one schedule whose result is not counted: what the process makes once and keeps (Dispatch's timer
    /// descriptors, which it opens and swaps as its threads need them; the temp-folder sweep) is made before the
    /// first counted schedule, which would otherwise see it as its leak.
    package func warmUp() {
        var scratch = SimulationTally()
        _ = Simulation(seed: 0, steps: 80).run(in: self, tally: &scratch)
    }

    /// A schedule's host configuration, before its simulated parts.
    func hostConfiguration() -> HostConfiguration {
        var configuration = HostConfiguration(extensionSearchPaths: [root], executableSearchPaths: [executableDirectory])
        configuration.allowedSandboxModes = [.strict, .bestEffort, .none]
        configuration.startInputs = startInputs
        return configuration
    }

    package func remove() {
        appFiles.close()
        clientFiles.close()
        _ = unlink("\(root)/Sim/Info.plist")
        rmdir("\(root)/Sim")
        rmdir(root)
    }
}

/// A count carried from one schedule to the next (`SimulationWorld.descriptorBaseline`).
final class DescriptorBaseline {
    var count: Int?
}

/// How many descriptors this process has open (counting the one listing them).
func openDescriptorCount() -> Int { listDirectory("/proc/self/fd")?.count ?? -1 }

/// This process's open descriptors, as "fd target", for a failure's report.
func openDescriptors() -> [String] {
    (listDirectory("/proc/self/fd") ?? []).map { fd in
        var buffer = [CChar](repeating: 0, count: 256)
        let n = readlink("/proc/self/fd/\(fd)", &buffer, 255)
        return "\(fd) " + (n > 0 ? String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?")
    }
}
