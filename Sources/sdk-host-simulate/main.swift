// `sdk-host-simulate --schedules N [--seed S] [--steps K]`: runs N seeded schedules of the engine on one thread
// (SDKSimulation) and prints how often each kind of outcome and worker transition was reached, then
// `N schedules, V violations`. Exits 1 naming the seed of each violation (at most 10 are printed); a seed
// replays exactly: `sdk-host-simulate --schedules 1 --seed S`.
import SDKHost
import SDKPosix
import SDKSimulation

#if canImport(Glibc)
import Glibc
#endif

func fail(_ text: String) -> Never {
    var line = "sdk-host-simulate: \(text)\n"
    line.withUTF8 { try? writeAll(2, UnsafeRawBufferPointer($0), detail: "stderr") }
    exit(2)
}

// Swift seeds its hashing per process, so a Dictionary's order (the engine's pools and queues are walked in it)
// differs from run to run, and so would a schedule. A seed replays exactly only with one hashing seed: this
// program runs itself again with the runtime's deterministic hashing.
if getenv("SWIFT_DETERMINISTIC_HASHING") == nil {
    setenv("SWIFT_DETERMINISTIC_HASHING", "1", 1)
    var argv = CommandLine.arguments.map { strdup($0) } + [nil]
    execv("/proc/self/exe", &argv)
    fail("cannot run itself again with deterministic hashing: \(String(cString: strerror(errno)))")
}

let usage = """
    usage: sdk-host-simulate --schedules N [--seed S] [--steps K] [--trace]
      --schedules N  how many schedules (seeds S, S+1, …)
      --seed S       the first seed (default 0x5D40000)
      --steps K      steps per schedule before the shutdown (default 80)
      --trace        a violation's report lists every step, not the last 25
    SIM_LOG=1 in the environment prints the engine's log (debug level) as it runs.
    """


var schedules: Int?
var seed: UInt64 = 0x5D4_0000
var steps = 80
var fullTrace = false
var arguments = CommandLine.arguments.dropFirst()
while let flag = arguments.popFirst() {
    if flag == "--trace" {
        fullTrace = true
        continue
    }
    guard let value = arguments.popFirst() else { fail("\(flag) needs a value\n\(usage)") }
    switch flag {
    case "--schedules":
        guard let n = Int(value), n > 0 else { fail("--schedules: '\(value)' is not a positive count") }
        schedules = n
    case "--seed":
        guard let s = value.hasPrefix("0x") ? UInt64(value.dropFirst(2), radix: 16) : UInt64(value) else {
            fail("--seed: '\(value)' is not a number")
        }
        seed = s
    case "--steps":
        guard let n = Int(value), n > 0, n <= 100_000 else { fail("--steps: '\(value)' is not a count from 1 to 100000") }
        steps = n
    default:
        fail("unknown option '\(flag)'\n\(usage)")
    }
}
guard let schedules else { fail("--schedules is required\n\(usage)") }
// The manifest's executable: this program (never run; the simulation's launcher stands in for posix_spawn).
guard let executable = currentExecutablePath() else { fail("cannot read /proc/self/exe") }
let world: SimulationWorld
do {
    world = try SimulationWorld(executable: executable)
} catch {
    fail("\(error)")
}
// A trap (a precondition the engine keeps, a descriptor dropped unclosed) ends the process: say which seed first.
nonisolated(unsafe) var currentSeed: UInt64 = 0
for sig in [SIGILL, SIGTRAP, SIGSEGV, SIGABRT, SIGBUS] {
    signal(sig) { sig in
        var text = [UInt8]("sdk-host-simulate: schedule with seed ".utf8)
        var digits: [UInt8] = []
        var n = currentSeed
        repeat { digits.append(UInt8(ascii: "0") + UInt8(n % 10)); n /= 10 } while n > 0
        text += digits.reversed() + Array(" trapped (replay: --schedules 1 --seed <it>)\n".utf8)
        _ = text.withUnsafeBytes { Glibc.write(2, $0.baseAddress, $0.count) }
        signal(sig, SIG_DFL)
        raise(sig)
    }
}
var tally = SimulationTally()
var violations = 0
let start = monotonicNanoseconds()
world.warmUp()
for n in 0..<schedules {
    let s = seed &+ UInt64(n)
    currentSeed = s
    var simulation = Simulation(seed: s, steps: steps)
    simulation.fullTrace = fullTrace
    if let problem = simulation.run(in: world, tally: &tally) {
        violations += 1
        if violations <= 10 { print("VIOLATION " + problem) }
    }
}
let seconds = Double(monotonicNanoseconds() - start) / 1e9
world.remove()
print("outcomes:")
for (kind, count) in tally.outcomes.sorted(by: { $0.key < $1.key }) { print("  \(kind): \(count)") }
print("completions that brought files back: \(tally.filesReturned)")
print("daemon clients: \(tally.clients), their requests: \(tally.clientRequests), outcomes they read: \(tally.clientOutcomes)")
print("worker transitions:")
for (kind, count) in tally.transitions.sorted(by: { $0.key < $1.key }) { print("  \(kind): \(count)") }
print("trace digest: 0x\(String(tally.traceDigest, radix: 16)) (the same seeds give the same digest)")
print("\(tally.steps) steps in \(Int(seconds * 1000)) ms: \(Int(Double(schedules) / max(seconds, 1e-9))) schedules/s on one thread")
if violations > 0 { print("replay one with: sdk-host-simulate --schedules 1 --seed <seed>") }
print("\(schedules) schedules, \(violations) violations")
exit(violations > 0 ? 1 : 0)
