// withDirectoryEntryName: a readdir entry's name is read where it lies and no further. The orphan sweep once died
// with SIGSEGV copying a whole `struct dirent` out of an entry that ended just before an unmapped page.
import HostTestSupport
import SDKPosix
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct DirectoryEntryTests {
    /// An entry laid out by hand so that its record ends at a page that cannot be read: reading past the name
    /// (as loading `entry.pointee` does, 280 bytes) would crash the test process.
    @Test func anEntryIsReadNoFurtherThanItsName() throws {
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        guard let base = mmap(nil, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
            base != MAP_FAILED
        else { throw SystemError("mmap", errno: errno) }
        defer { munmap(base, 2 * page) }
        #expect(mprotect(base + page, page, PROT_NONE) == 0)
        let nameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!
        let recordLength = (nameOffset + 4 + 7) & ~7  // "abc" and its NUL, rounded up as the kernel does
        #expect(recordLength < MemoryLayout<dirent>.size)
        let record = base + page - recordLength
        memset(record, 0, recordLength)
        for (i, byte) in "abc".utf8.enumerated() { record.storeBytes(of: byte, toByteOffset: nameOffset + i, as: UInt8.self) }
        let name = withDirectoryEntryName(record.assumingMemoryBound(to: dirent.self)) { String(decoding: $0, as: UTF8.self) }
        #expect(name == "abc")
    }

    @Test func everyNameLengthIsListedExactly() throws {
        let folder = try TemporaryFolder()
        var made: Set<String> = []
        for length in 1...255 {
            let name = String(repeating: "n", count: length - 1) + String(length % 10)
            let fd = open("\(folder.path)/\(name)", O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
            #expect(fd >= 0)
            close(fd)
            made.insert(name)
        }
        var listed: Set<String> = []
        let dir = try #require(opendir(folder.path))
        while let entry = readdir(dir) {
            let name = withDirectoryEntryName(entry) { String(decoding: $0, as: UTF8.self) }
            if name != "." && name != ".." { listed.insert(name) }
        }
        closedir(dir)
        #expect(listed == made)
        _ = folder.path
    }
}
