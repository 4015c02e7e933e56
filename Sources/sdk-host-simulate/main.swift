// `sdk-host-simulate --schedules N [--seed S] [--steps K] [--jobs J]`: runs N seeded schedules of the engine, each
// on one thread (SDKSimulation), and prints how often each kind of outcome and worker transition was reached, then
// `N schedules, V violations`. Exits 1 naming the seed of each violation (at most 10 are printed); a seed
// replays exactly: `sdk-host-simulate --schedules 1 --seed S`. With more than one job it runs itself once per job
// (`--shard K/J/PARENT`), each process taking every J-th seed, and adds up what they report: schedules share
// nothing, and a process per core keeps each one's descriptor and leak checks its own.
import SDKHost
import SDKPosix
import SDKSimulation
import CSDKShim

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
// The same run sets glibc's allocator for a program that makes and frees a great many small objects in bursts
// (a schedule's messages, closures and records): a per-thread cache of 1,000 blocks per size rather than 7, the
// heap's top kept rather than trimmed and grown again, and blocks up to 32 MiB (glibc's largest) from the heap
// rather than each its own mapping (~4% more schedules a second; docs/BENCHMARKS.md).
// A GLIBC_TUNABLES of the caller's is kept as it is.
if getenv("SWIFT_DETERMINISTIC_HASHING") == nil {
    setenv("SWIFT_DETERMINISTIC_HASHING", "1", 1)
    setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=1000:glibc.malloc.trim_threshold=268435456:"
        + "glibc.malloc.mmap_threshold=33554432:glibc.malloc.top_pad=67108864", 0)
    var argv = CommandLine.arguments.map { strdup($0) } + [nil]
    execv("/proc/self/exe", &argv)
    fail("cannot run itself again with deterministic hashing: \(String(cString: strerror(errno)))")
}

func report(_ tally: SimulationTally, schedules: Int, seconds: Double, processes: Int) -> Never {
    let violations = tally.violations
    print("outcomes:")
    for (kind, count) in tally.outcomes.sorted(by: { $0.key < $1.key }) { print("  \(kind): \(count)") }
    print("completions that brought files back: \(tally.filesReturned)")
    print("daemon clients: \(tally.clients), their requests: \(tally.clientRequests), outcomes they read: \(tally.clientOutcomes)")
    print("worker transitions:")
    for (kind, count) in tally.transitions.sorted(by: { $0.key < $1.key }) { print("  \(kind): \(count)") }
    print("trace digest: 0x\(String(tally.traceDigest, radix: 16)) (the same seeds give the same digest)")
    let rate = Double(schedules) / max(seconds, 1e-9)
    print("\(tally.steps) steps in \(Int(seconds * 1000)) ms: \(Int(rate)) schedules/s in \(processes) process(es), "
        + "\(Int(rate / Double(processes))) per process")
    if violations > 0 { print("replay one with: sdk-host-simulate --schedules 1 --seed <seed>") }
    print("\(schedules) schedules, \(violations) violations")
    exit(violations > 0 ? 1 : 0)
}

/// Runs the schedules in `jobs` copies of this program and adds up their tallies; then exits as `report` does.
func coordinate(jobs: Int, firstSeed seed: UInt64, schedules: Int) -> Never {
    let start = monotonicNanoseconds()
    var children: [(pid: pid_t, output: Int32)] = []
    for k in 0..<jobs {
        var pipe: [Int32] = [-1, -1]
        guard sdk_pipe_cloexec(&pipe) == 0 else { fail("pipe: \(String(cString: strerror(errno)))") }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_adddup2(&actions, pipe[1], 1)
        let argv = CommandLine.arguments + ["--shard", "\(k)/\(jobs)/\(getpid())"]
        var cArgs = argv.map { strdup($0) } + [nil]
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, "/proc/self/exe", &actions, nil, &cArgs, environ)
        posix_spawn_file_actions_destroy(&actions)
        for arg in cArgs { free(arg) }
        Glibc.close(pipe[1])
        guard rc == 0 else {
            for child in children { kill(child.pid, SIGKILL) }
            fail("cannot start a process for part \(k) of the schedules: \(String(cString: strerror(rc)))")
        }
        children.append((pid, pipe[0]))
    }
    // Read them all as they write (one that filled its pipe would wait on the reader).
    var outputs = [[UInt8]](repeating: [], count: jobs)
    var open = Set(0..<jobs)
    var buffer = [UInt8](repeating: 0, count: 65536)
    while !open.isEmpty {
        var polls = open.sorted().map { pollfd(fd: children[$0].output, events: Int16(POLLIN), revents: 0) }
        guard poll(&polls, nfds_t(polls.count), -1) >= 0 || errno == EINTR else { fail("poll: \(String(cString: strerror(errno)))") }
        for (i, k) in open.sorted().enumerated() where polls[i].revents != 0 {
            let n = read(children[k].output, &buffer, buffer.count)
            if n > 0 {
                outputs[k] += buffer[0..<n]
            } else if n == 0 || errno != EINTR {
                Glibc.close(children[k].output)
                open.remove(k)
            }
        }
    }
    var tally = SimulationTally()
    var printed = 0
    for (k, child) in children.enumerated() {
        var status: Int32 = 0
        while waitpid(child.pid, &status, 0) < 0 && errno == EINTR {}
        // Its violation reports (each starts a line with "VIOLATION "), then the marker, then its tally.
        let lines = String(decoding: outputs[k], as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
        let marker = lines.firstIndex { $0 == tallyMarker }
        for line in lines[..<(marker ?? lines.endIndex)] {
            if line.hasPrefix("VIOLATION ") { printed += 1 }
            if printed <= 10 && !line.isEmpty { print(line) }
        }
        let exited = ExitStatus(waitStatus: status)
        guard let marker, exited == .exited(0) else {
            // It trapped (its stderr, which is ours, names the seed) or was killed.
            tally.violations += 1
            print("VIOLATION part \(k) of \(jobs) (seeds \(seed &+ UInt64(k)), +\(jobs), …) ended \(exited) before its tally")
            continue
        }
        if !tally.merge(lines[(marker + 1)...].filter { !$0.isEmpty }) { fail("part \(k) of the schedules reported a tally that does not read") }
    }
    let seconds = Double(monotonicNanoseconds() - start) / 1e9
    report(tally, schedules: schedules, seconds: seconds, processes: jobs)
}

/// The CPUs this process may run on (its affinity mask: taskset and cpusets narrow it), at least 1.
func availableCPUs() -> Int {
    let count = Int(sdk_available_cpus())
    return count > 0 ? count : max(1, sysconf(Int32(_SC_NPROCESSORS_ONLN)))
}

let usage = """
    usage: sdk-host-simulate --schedules N [--seed S] [--steps K] [--jobs J] [--trace]
      --schedules N  how many schedules (seeds S, S+1, …)
      --seed S       the first seed (default 0x5D40000)
      --steps K      steps per schedule before the shutdown (default 80)
      --jobs J       processes to run them in (default: one per CPU this process may use)
      --trace        a violation's report lists every step, not the last 25
    SIM_LOG=1 in the environment prints the engine's log (debug level) as it runs.
    """

var schedules: Int?
var seed: UInt64 = 0x5D4_0000
var steps = 80
var fullTrace = false
var jobs = availableCPUs()
/// This process runs every `of`-th seed from the `index`-th, for the process `parent` (which it outlives by nothing).
var shard: (index: Int, of: Int, parent: pid_t)?
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
    case "--jobs":
        guard let n = Int(value), n > 0, n <= 256 else { fail("--jobs: '\(value)' is not a count from 1 to 256") }
        jobs = n
    case "--shard":
        let parts = value.split(separator: "/").compactMap { Int($0) }
        guard parts.count == 3, parts[1] > 0, (0..<parts[1]).contains(parts[0]) else { fail("--shard: '\(value)' is not K/J/PARENT") }
        shard = (parts[0], parts[1], pid_t(parts[2]))
    default:
        fail("unknown option '\(flag)'\n\(usage)")
    }
}
guard let schedules else { fail("--schedules is required\n\(usage)") }
jobs = min(jobs, schedules)

/// The marker between a shard's violation reports and its tally.
let tallyMarker = "=== tally"

if let shard {
    // Ends with the process that started it, whatever kills that one.
    do { try setParentDeathSignal(SIGKILL) } catch { fail("\(error)") }
    if getppid() != shard.parent { exit(2) }
} else if jobs > 1 {
    coordinate(jobs: jobs, firstSeed: seed, schedules: schedules)
}

// The manifest's executable: this program (never run: the simulation's launcher stands in for posix_spawn).
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
let start = monotonicNanoseconds()
world.warmUp()
for n in stride(from: shard?.index ?? 0, to: schedules, by: shard?.of ?? 1) {
    let s = seed &+ UInt64(n)
    currentSeed = s
    var simulation = Simulation(seed: s, steps: steps)
    simulation.fullTrace = fullTrace
    if let problem = simulation.run(in: world, tally: &tally) {
        tally.violations += 1
        if tally.violations <= 10 { print("VIOLATION " + problem) }
    }
}
let seconds = Double(monotonicNanoseconds() - start) / 1e9
world.remove()
if shard != nil {
    print(tallyMarker)
    for line in tally.lines { print(line) }
    exit(0)
}
report(tally, schedules: schedules, seconds: seconds, processes: 1)
