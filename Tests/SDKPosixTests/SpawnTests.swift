// posix_spawn through the shim: the child gets exactly fds 0-3, statuses and signals are decoded, and no
// descriptor is left open in the parent whatever happens.
import HostTestSupport
import SDKPosix
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// This process's descriptors as (number, what it refers to) pairs. A test compares two of these rather than
/// counts: another test's event loop may still be closing its descriptors on its own thread, and a count would
/// see that as a change. A descriptor opened and kept is a new pair even if its number was freed meanwhile.
func openDescriptors() -> Set<String> {
    Set(links(of: getpid()).map { "\($0.key) \($0.value)" })
}

func links(of pid: pid_t) -> [Int: String] {
    var out: [Int: String] = [:]
    guard let dir = opendir("/proc/\(pid)/fd") else { return out }
    defer { closedir(dir) }
    while let entry = readdir(dir) {
        let name = withDirectoryEntryName(entry) { String(decoding: $0, as: UTF8.self) }
        guard let fd = Int(name) else { continue }
        var buffer = [CChar](repeating: 0, count: 512)
        let n = readlink("/proc/\(pid)/fd/\(fd)", &buffer, 511)
        out[fd] = n > 0 ? String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?"
    }
    return out
}

@Suite(.serialized) struct SpawnTests {
    @Test func childGetsExactlyItsFourDescriptors() async throws {
        let channels = try spawnWithChannels(SpawnRequest(path: "/bin/sleep", arguments: ["sleep", "5"], environment: []))
        // Until `sleep` is asleep, the dynamic loader may hold a library open on descriptor 4 for a moment: that is
        // the child's own descriptor, not one it inherited. Asleep (`S` in /proc/<pid>/stat: a process loading its
        // libraries is running or waiting on the disk, never `S`), it holds only what it was given.
        let pid = channels.process.pid
        #expect(await eventually(timeout: 10) { procStatFields("\(pid)")?.first == "S" }, "the child never went to sleep")
        let fds = links(of: channels.process.pid)
        #expect(Set(fds.keys) == [0, 1, 2, 3], "child descriptors: \(fds)")
        #expect(fds[0] == "/dev/null")
        #expect(fds[1]?.hasPrefix("pipe:") == true)
        #expect(fds[2]?.hasPrefix("pipe:") == true)
        #expect(fds[3]?.hasPrefix("socket:") == true)
        // The parent is left holding the pipes' read ends and its own end of the socket, nothing else of the
        // child's: its write ends and the child's socket end are closed. Matched by object, not by a count or a
        // before-and-after set, because the suites beside this one open and close descriptors meanwhile.
        let childEnds = Set([fds[1], fds[2], fds[3]].compactMap { $0 })
        let ours = links(of: getpid())
        let parentSocket = ours[Int(channels.socket.rawValue)]
        #expect(parentSocket?.hasPrefix("socket:") == true)
        #expect(
            ours.filter { childEnds.contains($0.value) }.keys.sorted()
                == [Int(channels.stdout.rawValue), Int(channels.stderr.rawValue)].sorted(),
            "parent descriptors on the child's pipes and socket: \(ours.filter { childEnds.contains($0.value) })")
        #expect(channels.terminate(signal: SIGKILL) == .signaled(SIGKILL))
        let left = links(of: getpid()).filter { childEnds.contains($0.value) || $0.value == parentSocket }
        #expect(left.isEmpty, "descriptors left open: \(left)")
    }

    @Test func exitStatusAndOutputArrive() throws {
        let channels = try spawnWithChannels(SpawnRequest(
            path: "/bin/sh", arguments: ["sh", "-c", "echo out; echo err >&2; exit 3"], environment: []))
        #expect(try waitForExit(channels.process) == .exited(3))
        var buffer = [UInt8](repeating: 0, count: 64)
        let out = try buffer.withUnsafeMutableBytes { try readNonBlocking(channels.stdout.rawValue, into: $0) }
        #expect(out == .bytes(4))
        #expect(String(decoding: buffer[0..<4], as: UTF8.self) == "out\n")
        let err = try buffer.withUnsafeMutableBytes { try readNonBlocking(channels.stderr.rawValue, into: $0) }
        #expect(err == .bytes(4))
        channels.close()
    }

    @Test func childSeesTheSocketOnDescriptorThree() throws {
        let channels = try spawnWithChannels(SpawnRequest(
            path: "/bin/sh", arguments: ["sh", "-c", "printf ping >&3"], environment: []))
        #expect(try waitForExit(channels.process) == .exited(0))
        var buffer = [UInt8](repeating: 0, count: 16)
        let got = try buffer.withUnsafeMutableBytes { try readNonBlocking(channels.socket.rawValue, into: $0) }
        #expect(got == .bytes(4))
        #expect(String(decoding: buffer[0..<4], as: UTF8.self) == "ping")
        channels.close()
    }

    @Test func missingExecutableFailsWithENOENTAndLeaksNothing() {
        // Three tries: a suite running beside this one may open a descriptor between the two listings, but not
        // in every try, while a descriptor the failed spawn leaks shows in each.
        var left: [Set<String>] = []
        for _ in 0..<3 {
            let before = openDescriptors()
            #expect {
                _ = try spawnWithChannels(SpawnRequest(path: "/nonexistent/worker", arguments: ["w"], environment: []))
            } throws: { error in
                (error as? SystemError)?.errno == ENOENT && (error as? SystemError)?.detail == "/nonexistent/worker"
            }
            left.append(openDescriptors().subtracting(before))
            if left.last!.isEmpty { break }
        }
        #expect(left.last!.isEmpty, "descriptors left open, try by try: \(left)")
    }

    @Test func exitStatusDecoding() {
        #expect(SDKPosix.ExitStatus(waitStatus: 3 << 8) == .exited(3))
        #expect(SDKPosix.ExitStatus(waitStatus: SIGSEGV) == .signaled(SIGSEGV))
        #expect(SDKPosix.ExitStatus(waitStatus: SIGABRT | 0x80) == .signaled(SIGABRT))  // core dumped bit
        #expect(signalName(SIGKILL) == "SIGKILL")
    }
}

@Suite struct EventLoopTests {
    @Test func executeRunsOnTheLoopInOrderAndTimersFireInDeadlineOrder() async throws {
        let loop = try EventLoop(name: "test")
        let log = Mutex<[String]>([])
        let done = Mutex(false)
        for i in 0..<100 { loop.execute { log.withLock { $0.append("task\(i)") } } }
        loop.execute {
            precondition(loop.inLoop)
            loop.schedule(afterNanoseconds: 30_000_000) { log.withLock { $0.append("t30") } }
            let cancelled = loop.schedule(afterNanoseconds: 10_000_000) { log.withLock { $0.append("cancelled") } }
            loop.schedule(afterNanoseconds: 5_000_000) {
                log.withLock { $0.append("t5") }
                loop.cancelTimer(cancelled)
                loop.schedule(afterNanoseconds: 1_000_000) { log.withLock { $0.append("t5+1") } }
            }
            loop.schedule(afterNanoseconds: 60_000_000) { done.withLock { $0 = true } }
        }
        #expect(!loop.inLoop)
        for _ in 0..<2000 where !done.withLock({ $0 }) { try await Task.sleep(nanoseconds: 1_000_000) }
        let events = log.withLock { $0 }
        #expect(Array(events.prefix(100)) == (0..<100).map { "task\($0)" })
        #expect(Array(events.dropFirst(100)) == ["t5", "t5+1", "t30"])
        let stopped = Mutex(false)
        loop.stop { stopped.withLock { $0 = true } }
        for _ in 0..<2000 where !stopped.withLock({ $0 }) { try await Task.sleep(nanoseconds: 1_000_000) }
        #expect(stopped.withLock { $0 })
        #expect(loop.execute {} == false, "a stopped loop refuses work")
    }
}
