// Exit notices on the engine (SDKPosix/ExitNotice.swift has the watcher): a worker's requests end when the kernel
// starts its exit, before its teardown; it is still reaped when its exit descriptor fires (HostEngine+Workers).

#if canImport(Glibc)
import Glibc
#endif
import SDKPosix

extension HostEngine {
    /// Hands the worker's exit-notice page to the watcher, if its runtime registered one (at its start, so by
    /// its `welcome`). Only a worker whose exit descriptor is in the epoll set: one that ends early is reaped
    /// there, never by `pollForExit`. The notice runs on the watcher's thread, which takes the loop's turn when the
    /// loop sleeps (saving a wake-up), else hands it over.
    func watchExitNotice(_ worker: WorkerProcess) {
        guard let page = worker.exitNotice, worker.exitWatched, !worker.lifecycle.phase.isOver, !worker.exitNoticeWatched else { return }
        let pid = worker.pid
        // The watcher's thread may call back after the engine has gone (it calls outside its lock, after an
        // `unwatch` may have returned). It touches only the loop and `noticed`, made here while the engine is alive;
        // the loop runs `noticed` only while it accepts tasks, and so while the engine is alive (a stopped loop drops
        // it). An unowned reference read on the watcher's thread, even to copy it into the task, would trap once the
        // engine is gone.
        let noticed: @Sendable (ExitNoticeWatcher.Notice) -> Void = { [unowned self] notice in self.exitNoticed(pid: pid, notice) }
        worker.exitNoticeWatched = exitNotices.watch(page) { [loop] notice in
            loop.executeInline(asLoop: true) { noticed(notice) }
        }
    }

    /// Who watches exit notices (`HostConfiguration.exitNoticeWatcher`).
    var exitNotices: any ExitNoticeWatching { configuration.exitNoticeWatcher ?? ExitNoticeWatcher.shared }

    func unwatchExitNotice(_ worker: WorkerProcess) {
        guard worker.exitNoticeWatched, let page = worker.exitNotice else { return }
        worker.exitNoticeWatched = false
        exitNotices.unwatch(page)
    }

    /// A worker's exit notice changed: if /proc says the process is exiting, and not cleanly, its requests end
    /// now, with the status it is exiting with, instead of once the kernel has torn it down; it is reaped when
    /// its exit descriptor fires. Anything else leaves it to that descriptor.
    func exitNoticed(pid: pid_t, _ notice: ExitNoticeWatcher.Notice) {
        guard let worker = workers.worker(pid: pid, where: \.exitNoticeWatched) else { return }
        worker.exitNoticeWatched = false
        switch notice {
        case .exiting(let status):
            // A clean exit has no requests to end early (a retired or idle worker): reaped as usual.
            guard status != .exited(0) else { return }
            log(.debug, "\(worker.extensionID) pid \(pid) is exiting (\(status)): its requests end now")
            guard worker.lifecycle.noticeExit(status) else { return }
            workers.awaitReaping(worker)
            workerEnded(worker, status: status)
            // It is exiting; should its main thread alone have ended, the rest goes too.
            worker.finishOff()
            killAgainUntilReaped(worker)
        case .notExiting:
            log(.warning, "\(worker.extensionID) pid \(pid) changed its exit notice but is not exiting; no longer watched")
        case .unreadable(let error):
            log(.debug, "\(worker.extensionID) pid \(pid): exit notice, but /proc/\(pid)/stat is unreadable "
                + "(\(String(cString: strerror(error))))")
        case .tooManyWakeups:
            log(.warning, "\(worker.extensionID) pid \(pid) woke its exit notice \(ExitNoticeWatcher.spuriousWakeLimit) "
                + "times without exiting; no longer watched")
        }
    }
}
