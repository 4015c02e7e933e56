// Small file helpers for manifests, configuration, crash reports and the CLI: whole-file reads and writes,
// directory listings, mkdir -p. Plain libc, no Foundation.
import SDKWire
import SDKPosix
import CSDKShim

#if canImport(Glibc)
import Glibc
#endif

/// The names in a directory, or nil if it cannot be read.
/// With `prefix`, only the names that start with it: the others are skipped before a String is made (a temporary
/// folder may hold thousands of other programs' entries).
package func listDirectory(_ path: String, prefix: String = "") -> [String]? {
    guard let dir = opendir(path) else { return nil }
    defer { closedir(dir) }
    let wanted = Array(prefix.utf8)
    var names: [String] = []
    while let entry = readdir(dir) {
        let name = withDirectoryEntryName(entry) { bytes -> String? in
            guard bytes.starts(with: wanted) else { return nil }
            return String(decoding: bytes, as: UTF8.self)
        }
        if let name, name != "." && name != ".." { names.append(name) }
    }
    return names
}

/// Reads a whole (small) file.
package func readFile(_ path: String) throws(SystemError) -> [UInt8] {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { throw SystemError("open", errno: errno, detail: path) }
    defer { close(fd) }
    // Read straight into the result, sized by the file (one byte more, so that a file that has not grown ends in
    // one read more); a file that grows meanwhile (or one of /proc's, sized 0) gets more room as it is read.
    var info = stat()
    var capacity = fstat(fd, &info) == 0 ? max(Int(info.st_size) + 1, 512) : 4096
    var out: [UInt8] = []
    while true {
        var failure: Int32 = 0
        var ended = false
        let previous = out
        out = [UInt8](unsafeUninitializedCapacity: capacity) { buffer, initialized in
            initialized = UnsafeMutableBufferPointer(rebasing: buffer[..<previous.count]).initialize(from: previous).1
            while initialized < capacity {
                let n = read(fd, buffer.baseAddress! + initialized, capacity - initialized)
                if n < 0 {
                    if errno == EINTR { continue }
                    failure = errno
                    return
                }
                if n == 0 {
                    ended = true
                    return
                }
                initialized += n
            }
        }
        if failure != 0 { throw SystemError("read", errno: failure, detail: path) }
        if ended { return out }
        capacity *= 2
    }
}

/// Why `readRegularFile` refused a file, said plainly ("not a regular file (a FIFO)").
package struct FileReadError: Error, CustomStringConvertible {
    package let description: String
}

/// Reads a small file that must be a regular file of at most `maxBytes`: a manifest or a configuration file, which
/// whoever can write its folder may replace by a FIFO (opening it waited for a writer for ever, and the daemon with
/// it), a link to /dev/zero (reading it never ended: gigabytes in seconds) or a file of hundreds of megabytes.
/// Checked before it is opened for reading (opening a device may do something), and read through a descriptor of
/// that same file (sdk_open_regular_file; a FIFO or a device is never opened).
package func readRegularFile(_ path: String, maxBytes: Int, followingLinks: Bool = true) throws(FileReadError) -> [UInt8] {
    func kind(_ mode: mode_t) -> String {
        switch mode & S_IFMT {
        case S_IFIFO: "a FIFO"
        case S_IFCHR: "a character device"
        case S_IFBLK: "a block device"
        case S_IFDIR: "a folder"
        case S_IFSOCK: "a socket"
        case S_IFLNK: "a symbolic link"
        default: "not a plain file"
        }
    }
    // What the path names is checked before anything is opened for reading (a device's open is never run), and
    // what is then opened is that same file (sdk_open_regular_file).
    // Without /proc it fails rather than open the path a second time (which would run a device's open).
    var info = stat()
    let fd = sdk_open_regular_file(path, followingLinks ? 0 : 1, 0, &info)
    guard fd >= 0 else {
        switch fd {
        case SDK_OPEN_NOT_REGULAR: throw FileReadError(description: "not a regular file (\(kind(info.st_mode)))")
        case SDK_OPEN_CHANGED: throw FileReadError(description: "changed while it was opened")
        default: throw FileReadError(description: SystemError("open", errno: errno, detail: path).description)
        }
    }
    defer { close(fd) }
    func tooLarge(_ size: Int) -> FileReadError {
        FileReadError(description: "\(size) bytes or more; at most \(maxBytes) are read")
    }
    guard Int(info.st_size) <= maxBytes else { throw tooLarge(Int(info.st_size)) }
    // One byte more than allowed: a file that grew since fstat is refused, not cut short.
    let capacity = maxBytes + 1
    var failure: Int32 = 0
    var out: [UInt8] = []
    out.reserveCapacity(min(capacity, Int(info.st_size) + 1))
    var chunk = [UInt8](repeating: 0, count: min(capacity, 64 << 10))
    while out.count < capacity {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, min($0.count, capacity - out.count)) }
        if n < 0 {
            if errno == EINTR { continue }
            failure = errno
            break
        }
        if n == 0 { break }
        out += chunk[0..<n]
    }
    if failure != 0 { throw FileReadError(description: SystemError("read", errno: failure, detail: path).description) }
    guard out.count <= maxBytes else { throw tooLarge(out.count) }
    return out
}

/// Writes `bytes` to `path` (created 0600 or truncated; with `exclusive`, only created: an existing file or a
/// symlink there is an error).
package func writeFile(_ path: String, _ bytes: [UInt8], mode: mode_t = 0o600, exclusive: Bool = false) throws(SystemError) {
    let fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL | O_NOFOLLOW : O_TRUNC), mode)
    guard fd >= 0 else { throw SystemError("open", errno: errno, detail: path) }
    defer { close(fd) }
    try bytes.withUnsafeBytes { raw in Result { () throws(SystemError) in try writeAll(fd, raw, detail: path) } }.get()
}

/// mkdir -p with `mode` for the folders it creates. True if the folder exists afterwards.
package func makeDirectories(_ path: String, mode: mode_t) -> Bool {
    var st = stat()
    if stat(path, &st) == 0 { return (st.st_mode & S_IFMT) == S_IFDIR }
    if let slash = path.lastIndex(of: "/"), slash != path.startIndex {
        _ = makeDirectories(String(path[..<slash]), mode: mode)
    }
    return mkdir(path, mode) == 0 || errno == EEXIST
}
