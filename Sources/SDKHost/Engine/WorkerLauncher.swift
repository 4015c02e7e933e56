// WorkerLauncher: the seam between the engine and process creation. The engine asks a launcher for a worker
// and gets back a child it can signal, watch and reap, plus the worker's socket and output pipes. The real
// launcher is posix_spawn with a pidfd; tests substitute launchers whose spawn fails, whose reap fails (as when
// the app ignores SIGCHLD) or whose exit descriptor cannot be watched, and the simulation substitutes workers
// that live in the test process. The engine handles each of those paths the same way for every launcher.

#if canImport(Glibc)
import SDKWire
import Glibc
#endif
import SDKPosix

/// A launched worker process as the engine sees it. Loop-confined once handed to the engine.
package protocol WorkerChild: AnyObject {
    /// The process id (for logs, `pid(for:)` and crash reports).
    var pid: pid_t { get }
    /// A descriptor that becomes readable when the process has exited (a pidfd for real processes).
    var exitDescriptor: Int32 { get }
    /// Sends a signal; one that has already exited is not an error.
    func signal(_ signal: Int32)
    /// Reaps without blocking: the status, nil if it has not exited, or an error when the status is gone.
    func reap() throws(SystemError) -> ExitStatus?
    /// Releases the exit descriptor. Called once, after the engine stopped watching it.
    func close()
}

/// What a launcher returns: the child and the host's ends of its channels.
package struct LaunchedWorker: ~Copyable {
    package var child: any WorkerChild
    // Optional so that the engine can take each one out (Swift cannot move single fields out of the struct).
    package var socket: FileDescriptor?
    package var stdout: FileDescriptor?
    package var stderr: FileDescriptor?
    /// The page the worker registers its exit notice in (ExitNotice.swift), if it was given one.
    package var exitNotice: ExitNoticePage?

    package init(child: any WorkerChild, socket: consuming FileDescriptor, stdout: consuming FileDescriptor,
                 stderr: consuming FileDescriptor, exitNotice: ExitNoticePage? = nil)
    {
        self.child = child
        self.exitNotice = exitNotice
        self.socket = .some(consume socket)
        self.stdout = .some(consume stdout)
        self.stderr = .some(consume stderr)
    }
}

/// Makes and removes workers' private temp folders: in the file system, or (the simulation) in memory.
package protocol WorkerFolders: Sendable {
    /// A new private folder in `base`.
    func make(in base: String) throws(HostError) -> String
    /// Removes `folder` and what the worker left in it; whether it is gone.
    @discardableResult
    func remove(_ folder: String) -> Bool
}

/// Workers' folders in the file system: `sdk-host-worker.<host pid>.XXXXXX`, mode 0700, removed whole.
package struct FileSystemFolders: WorkerFolders {
    package init() {}
    package func make(in base: String) throws(HostError) -> String { try SandboxProfile.makeWorkerDirectory(in: base) }
    @discardableResult
    package func remove(_ folder: String) -> Bool { removeTree(folder) }
}

/// Creates worker processes.
package protocol WorkerLauncher: Sendable {
    func launch(_ request: SpawnRequest) throws(SystemError) -> LaunchedWorker
}

/// The real launcher: posix_spawn, a socketpair on fd 3, stdout and stderr pipes, a pidfd, and the exit-notice
/// page on fd 5 when the request asks for one.
package struct PosixLauncher: WorkerLauncher {
    package init() {}

    package func launch(_ request: SpawnRequest) throws(SystemError) -> LaunchedWorker {
        let channels = try spawnWithChannels(request)
        let notice = channels.exitNotice
        let child = PidfdChild(channels.process)
        return LaunchedWorker(child: child, socket: channels.socket, stdout: channels.stdout, stderr: channels.stderr,
                              exitNotice: notice)
    }
}

/// A real child process, watched and reaped through its pidfd.
package final class PidfdChild: WorkerChild {
    private var process: SpawnedProcess?
    package let pid: pid_t
    package let exitDescriptor: Int32

    package init(_ process: consuming SpawnedProcess) {
        pid = process.pid
        exitDescriptor = process.pidfd.rawValue
        self.process = consume process
    }

    package func signal(_ signal: Int32) {
        guard let process = process.take() else { return }
        process.signal(signal)
        self.process = consume process
    }

    package func reap() throws(SystemError) -> ExitStatus? {
        guard let process = process.take() else { return nil }
        let result = Result { () throws(SystemError) in try process.reap() }
        self.process = consume process
        return try result.get()
    }

    package func close() { process.take()?.close() }

    deinit { process.take()?.close() }
}
