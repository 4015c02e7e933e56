// FileAttachment: an attachment that is an open file rather than bytes. It travels as a descriptor (SCM_RIGHTS)
// beside the frame that names it, so a 1 GiB payload is never copied through the socket (DESIGN "Streaming and
// large payloads"). It owns its descriptor and closes it when the last reference goes: a message that is
// dropped, rejected or finished closes every descriptor it carried, on every path, with no bookkeeping.
//
// Read-only by construction: a file is opened O_RDONLY, generated data is a memfd sealed against writing, and a
// caller's descriptor is reopened read-only unless it already is (an unsealed memfd is copied into a sealed one).
// Received descriptors are read-only snapshots or refused with their message (`refusedOnReceipt`): a regular file
// open for reading only, or a memfd sealed against writing, growing and shrinking. Anything else (a socket, a
// pipe that could block a reader forever, a directory, an O_PATH or writable descriptor, a memfd its sender could
// still change) ends the connection that sent it.

#if canImport(Glibc)
import Glibc
#endif
import CSDKShim

/// A failed file operation on an attachment: what, on which path or descriptor, and the system's reason.
public struct FileAttachmentError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The operation, e.g. "open" or "write".
    public let operation: String
    /// The path or descriptor it was about.
    public let subject: String
    /// The errno value (0 when the failure was not a system call's).
    public let code: Int32
    /// Why, in words.
    public let reason: String

    init(_ operation: String, _ subject: String, errno code: Int32) {
        self.operation = operation
        self.subject = subject
        self.code = code
        reason = String(cString: strerror(code))
    }

    init(_ operation: String, _ subject: String, reason: String) {
        self.operation = operation
        self.subject = subject
        code = 0
        self.reason = reason
    }

    public var description: String { "\(operation) \(subject): \(reason)" }
}

/// An open, read-only file carried by an `ExtensionItem` (`fileAttachments`) and passed between processes as a
/// descriptor. Create one from a path, from bytes (a sealed memfd), or from a descriptor you own; read it,
/// map it, or save it. It closes its descriptor when released. Equality is identity.
public final class FileAttachment: Sendable, Hashable, CustomStringConvertible {
    private let fd: Int32

    /// Takes ownership of `fd`, which must be open; it is closed when the attachment is released.
    package init(adopting fd: Int32) {
        precondition(fd >= 0, "FileAttachment(adopting:) needs an open descriptor")
        self.fd = fd
    }

    /// Opens the file at `path` read-only.
    ///
    /// - Throws: `FileAttachmentError` when it cannot be opened or is not a regular file.
    public convenience init(contentsOf path: String) throws(FileAttachmentError) {
        // What the path names is checked before it is opened for reading: a FIFO's open waited for a writer, for
        // ever, and a device's open runs its driver (sdk_open_regular_file).
        var info = stat()
        let fd = sdk_open_regular_file(path, 0, 1, &info)
        guard fd >= 0 else {
            switch fd {
            case SDK_OPEN_NOT_REGULAR: throw FileAttachmentError("attach", path, reason: Self.notARegular(info.st_mode) ?? "not a regular file")
            case SDK_OPEN_CHANGED: throw FileAttachmentError("attach", path, reason: "it changed while it was opened")
            default: throw FileAttachmentError("open", path, errno: errno)
            }
        }
        self.init(adopting: fd)
    }

    /// Puts `bytes` in a new memfd, sealed so that no process can change it.
    ///
    /// - Parameter name: Shows in `/proc/<pid>/fd` as `memfd:<name>`.
    /// - Throws: `FileAttachmentError` when the memfd cannot be made (out of memory, say).
    public convenience init(bytes: some Collection<UInt8>, name: String = "sdk-host-attachment") throws(FileAttachmentError) {
        let fd = sdk_memfd(name)
        guard fd >= 0 else { throw FileAttachmentError("memfd_create", name, errno: errno) }
        let failure: FileAttachmentError? = {
            let written: Int32? = bytes.withContiguousStorageIfAvailable { Self.writeAll(fd, UnsafeRawBufferPointer($0)) }
                ?? Array(bytes).withUnsafeBytes { Self.writeAll(fd, $0) }
            if let e = written, e != 0 { return FileAttachmentError("write", "memfd \(name)", errno: e) }
            if sdk_seal_readonly(fd) != 0 { return FileAttachmentError("seal", "memfd \(name)", errno: errno) }
            return nil
        }()
        if let failure {
            close(fd)
            throw failure
        }
        self.init(adopting: fd)
    }

    /// A read-only attachment of the file `fd` refers to; `fd` stays yours. A descriptor open for reading only,
    /// or a memfd sealed against writing, is duplicated; any other is reopened read-only.
    ///
    /// - Throws: `FileAttachmentError` when `fd` is not an open regular file or cannot be reopened.
    public convenience init(duplicating fd: Int32) throws(FileAttachmentError) {
        let subject = "descriptor \(fd)"
        let flags = fcntl(fd, F_GETFL)
        guard flags >= 0 else { throw FileAttachmentError("fcntl", subject, errno: errno) }
        if let problem = Self.notARegularFile(fd) { throw FileAttachmentError("attach", subject, reason: problem) }
        if sdk_flags_path_only(flags) == 1 { throw FileAttachmentError("attach", subject, reason: "an O_PATH descriptor, which cannot be read") }
        // Sealed first: a sealed file is a snapshot memfd, and needs no /proc link read.
        if sdk_is_snapshot_memfd(fd) != 1 && sdk_is_memfd(fd) == 1 {
            // Whoever holds it could still change it: attach a sealed copy of what it holds now.
            var info = stat()
            guard fstat(fd, &info) == 0 else { throw FileAttachmentError("fstat", subject, errno: errno) }
            let copy = sdk_memfd("sdk-host-attachment")
            guard copy >= 0 else { throw FileAttachmentError("memfd_create", subject, errno: errno) }
            let rc = sdk_copy_file(fd, copy, UInt64(info.st_size))
            if rc != 0 || sdk_seal_readonly(copy) != 0 {
                let error = rc != 0 ? rc : errno
                close(copy)
                throw FileAttachmentError("copy", subject, errno: error)
            }
            self.init(adopting: copy)
            return
        }
        let copy: Int32
        if flags & O_ACCMODE == O_RDONLY || sdk_is_write_sealed(fd) == 1 {
            copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
            guard copy >= 0 else { throw FileAttachmentError("dup", subject, errno: errno) }
        } else {
            copy = open("/proc/self/fd/\(fd)", O_RDONLY | O_CLOEXEC | O_NOCTTY)
            guard copy >= 0 else { throw FileAttachmentError("reopen read-only", subject, errno: errno) }
        }
        self.init(adopting: copy)
    }

    deinit { close(fd) }

    /// Why a descriptor received from a peer cannot be an attachment, or nil: it must be a read-only snapshot, a
    /// regular file open for reading only or a memfd sealed against writing, growing and shrinking.
    package static func refusedOnReceipt(_ fd: Int32) -> String? {
        let flags = fcntl(fd, F_GETFL)
        guard flags >= 0 else { return "fcntl failed: \(String(cString: strerror(errno)))" }
        if sdk_flags_path_only(flags) == 1 { return "an O_PATH descriptor, not an open file" }
        if let problem = notARegularFile(fd) { return problem }
        // A memfd's seals bind every descriptor of it, however opened; any other file must be open read-only.
        // Only a memfd can carry these seals (seals exist only on tmpfs and hugetlbfs files, and one not made by
        // memfd_create starts sealed against new seals), so a sealed file is taken without reading its /proc link,
        // which cost a syscall per descriptor received. Where that link cannot be read, a sealed memfd open for
        // writing is now taken too: it cannot change, whatever its mode.
        if sdk_is_snapshot_memfd(fd) == 1 { return nil }
        if sdk_is_memfd(fd) == 1 { return "a memfd not sealed against writing, growing and shrinking" }
        return flags & O_ACCMODE == O_RDONLY ? nil : "open for writing; attachments are read-only"
    }

    /// Why `fd` cannot be an attachment (it is not a regular file, memfds included), or nil.
    package static func notARegularFile(_ fd: Int32) -> String? {
        var st = stat()
        guard fstat(fd, &st) == 0 else { return "fstat failed: \(String(cString: strerror(errno)))" }
        return notARegular(st.st_mode)
    }

    /// Why a file of this mode cannot be an attachment, or nil.
    static func notARegular(_ mode: mode_t) -> String? {
        let type = mode & S_IFMT
        if type == S_IFREG { return nil }
        let name = switch type {
        case S_IFSOCK: "a socket"
        case S_IFIFO: "a pipe"
        case S_IFDIR: "a directory"
        case S_IFCHR: "a character device"
        case S_IFBLK: "a block device"
        default: "not a regular file"
        }
        return "\(name), not a regular file or memfd"
    }

    /// The size in bytes.
    public var size: Int {
        var st = stat()
        return fstat(fd, &st) == 0 ? Int(st.st_size) : 0
    }

    /// Every byte, read from offset 0 (the shared file offset is not moved).
    ///
    /// - Throws: `FileAttachmentError` when a read fails.
    public func readAll() throws(FileAttachmentError) -> [UInt8] {
        try read(from: 0, count: size)
    }

    /// Up to `count` bytes from `offset` (fewer at the end of the file).
    ///
    /// - Throws: `FileAttachmentError` when a read fails.
    public func read(from offset: Int, count: Int) throws(FileAttachmentError) -> [UInt8] {
        guard count > 0 else { return [] }
        var failure: Int32 = 0
        let bytes = [UInt8](unsafeUninitializedCapacity: count) { buffer, filled in
            filled = 0
            while filled < count {
                let n = pread(fd, buffer.baseAddress! + filled, count - filled, off_t(offset + filled))
                if n > 0 {
                    filled += n
                } else if n == 0 {
                    break
                } else if errno != EINTR {
                    failure = errno
                    break
                }
            }
        }
        if failure != 0 { throw FileAttachmentError("read", "\(self)", errno: failure) }
        return bytes
    }

    /// Writes the contents to a new file at `path` (mode 0644), in the kernel where it can
    /// (`copy_file_range`). An existing file there is refused rather than overwritten.
    ///
    /// - Throws: `FileAttachmentError` when the file cannot be created or the copy fails.
    public func save(to path: String) throws(FileAttachmentError) {
        let out = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o644)
        guard out >= 0 else { throw FileAttachmentError("create", path, errno: errno) }
        defer { close(out) }
        let rc = sdk_copy_file(fd, out, UInt64(size))
        if rc != 0 { throw FileAttachmentError("copy to", path, errno: rc) }
    }

    /// Calls `body` with the descriptor, which stays owned by the attachment: do not close it, and use
    /// positioned reads (`pread`, `mmap`), since the file offset is shared with every copy of it.
    public func withUnsafeFileDescriptor<R, E: Error>(_ body: (Int32) throws(E) -> R) throws(E) -> R {
        try body(fd)
    }

    /// The descriptor, for the transport that sends it.
    package var rawDescriptor: Int32 { fd }

    public static func == (a: FileAttachment, b: FileAttachment) -> Bool { a === b }
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
    public var description: String { "FileAttachment(fd \(fd), \(size) bytes)" }

    private static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Int32 {
        var offset = 0
        while offset < bytes.count {
            let n = write(fd, bytes.baseAddress! + offset, bytes.count - offset)
            if n < 0 {
                if errno == EINTR { continue }
                return errno
            }
            offset += n
        }
        return 0
    }
}
