// SystemError: a failed syscall, with the operation, errno and what it was applied to.

#if canImport(Glibc)
import Glibc
#endif

/// A system call that failed. `operation` names the call, `errno` its error, `detail` what it was acting on.
public struct SystemError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The call that failed, e.g. "posix_spawn".
    public let operation: String
    /// The errno value.
    public let errno: Int32
    /// The object of the call: a path, a pid, a descriptor.
    public let detail: String

    /// Creates an error.
    public init(_ operation: String, errno: Int32, detail: String = "") {
        self.operation = operation
        self.errno = errno
        self.detail = detail
    }

    public var description: String {
        let message = String(cString: strerror(errno))
        return detail.isEmpty ? "\(operation): \(message)" : "\(operation) \(detail): \(message)"
    }
}
