// FileDescriptor: a descriptor with exactly one owner. It is ~Copyable, ownership moves with `consuming`, and
// it must be closed explicitly: a descriptor dropped without `close()` is a leak, and the deinit traps so that
// tests find it (swift-subprocess does the same).

#if canImport(Glibc)
import Glibc
#endif
import CSDKShim

/// An open file descriptor owned by exactly one value.
public struct FileDescriptor: ~Copyable {
    /// The raw descriptor number, for syscalls. Valid until `close()`.
    public let rawValue: Int32

    /// Takes ownership of `rawValue`, which must be open and close-on-exec.
    public init(adopting rawValue: Int32) { self.rawValue = rawValue }

    /// Closes the descriptor. Never retried on EINTR (Linux has already released it); EBADF traps.
    public consuming func close() {
        let fd = rawValue
        discard self
        if SimulatedKernel.isSimulated(fd) { return kernel(fd).close(fd) }
        if Glibc.close(fd) == -1 {
            let e = errno
            if e == EBADF { fatalError("close(\(fd)): EBADF — closed twice or never open") }
        }
    }

    /// Gives up ownership without closing, returning the raw descriptor.
    public consuming func release() -> Int32 {
        let fd = rawValue
        discard self
        return fd
    }

    deinit {
        // Every open descriptor is >= 0, so this always traps; the test keeps the compiler from flagging the
        // deinit's epilogue as unreachable.
        if rawValue >= 0 { fatalError("FileDescriptor \(rawValue) was dropped without close(): a descriptor leak") }
    }
}
