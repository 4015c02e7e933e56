// `sdk-host bench --peer PATH`: runs another host's echo benchmark (bench/go-plugin builds go-plugin's) in the same
// run as ours, and prints its figures beside ours, as ratios to the same raw round trip. The peer prints one
// "key value" line per figure on stdout; keys are lowercase words joined by underscores.

import SDKPosix

#if canImport(Glibc)
import Glibc
#endif

enum PeerBench {
    /// Runs the peer to its end and returns its figures, in the order printed. Fails (exit 1) with the peer's
    /// complaint if it exits unsuccessfully or prints anything that is not a figure.
    static func run(_ path: String) -> [(key: String, value: Double)] {
        guard access(path, X_OK) == 0 else { fail("bench: --peer '\(path)' is not an executable file") }
        guard let peer = try? spawnWithChannels(SpawnRequest(path: path, arguments: [path], environment: environ()))
        else { fail("bench: cannot start the peer '\(path)'") }
        KillOnTermination.add(peer.process.pid)
        let output = readToEnd(peer.stdout.rawValue)
        let errors = readToEnd(peer.stderr.rawValue)
        let pid = peer.process.pid
        let status = peer.terminate(signal: 0)
        KillOnTermination.remove(pid)
        guard let status, status == SDKPosix.ExitStatus.exited(0) else {
            fail("bench: the peer '\(path)' ended \(status.map { "\($0)" } ?? "unreaped"): \(String(decoding: errors.suffix(2048), as: UTF8.self))")
        }
        var figures: [(key: String, value: Double)] = []
        for line in String(decoding: output, as: UTF8.self).split(separator: "\n") {
            let parts = line.split(separator: " ")
            guard parts.count == 2, let value = Double(parts[1]), value.isFinite,
                parts[0].allSatisfy({ ("a"..."z").contains($0) || ("0"..."9").contains($0) || $0 == "_" })
            else { fail("bench: the peer printed '\(line.prefix(200))', not 'key value'") }
            figures.append((String(parts[0]), value))
        }
        return figures
    }

    /// Everything from a non-blocking pipe until EOF (the peer runs for seconds, so a short sleep between reads).
    static func readToEnd(_ fd: Int32) -> [UInt8] {
        var data: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while data.count < 1 << 20 {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n > 0 {
                data += buffer[0..<n]
            } else if n == 0 {
                break
            } else if errno == EAGAIN || errno == EINTR {
                usleep(2000)
            } else {
                break
            }
        }
        return data
    }

    /// This process's environment, for a peer that needs PATH or HOME.
    static func environ() -> [String] {
        var out: [String] = []
        var entry = Glibc.environ
        while let pointer = entry.pointee {
            out.append(String(cString: pointer))
            entry += 1
        }
        return out
    }
}
