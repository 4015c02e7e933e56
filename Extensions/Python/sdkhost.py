"""sdkhost: the Python worker runtime for sdk-host extensions (docs/PYTHON-RUNTIME.md).

An extension is a script that imports this module and hands its handler to `run`::

    import sdkhost

    def handle(ctx):                      # or: async def handle(ctx)
        ctx.complete(ctx.input_items)

    sdkhost.run(handle)

The runtime owns the host connection (descriptor 3): the handshake, heartbeats, partial results within credit,
descriptors, host calls, idle exit and exit when the host goes away. It speaks the worker protocol of
docs/PROTOCOL.md, as the Swift runtime (Sources/SDKExtension) does, with the standard library only, and runs on
Python 3.9 and later.

Threads: the main thread reads the connection and answers pings itself, so a handler that blocks or spins never
looks hung. A synchronous handler runs on a pool thread; an async one runs as a Task on one asyncio loop in a thread
of its own. Frames go out whole, under one lock, from whichever thread finishes the work.
"""

import array
import collections
import datetime
import errno
import fcntl
import itertools
import os
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time

__all__ = ["run", "Context", "Item", "File", "ExtensionError", "HostCallError"]

#: The protocol version sent in `welcome`; a `hello` of another version ends the worker (exit 2).
PROTOCOL_VERSION = 2
#: Partial results of one request the host may have not yet credited back.
STREAM_WINDOW = 16
#: The most descriptors one message may carry.
MAX_DESCRIPTORS = 64
#: The largest frame payload either side accepts.
MAX_FRAME_BYTES = 16 << 20
#: The deepest container nesting either side accepts.
MAX_DEPTH = 512

_EX_PROTOCOL = 2
_EX_USAGE = 64
_PID = os.getpid()


def _log(message):
    """One line on stderr, which the host logs (and keeps the last of for a crash report)."""
    try:
        os.write(2, ("sdk-extension[%d]: %s\n" % (_PID, message)).encode("utf-8", "replace"))
    except OSError:
        pass


def _exit(status):
    """Ends the process now, from any thread, without waiting for handlers."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
    os._exit(status)


# MARK: - Errors


class ExtensionError(Exception):
    """An error with a domain, a code and a message: what a cancelled request reports to the app.

    Raise it from a handler to cancel the request with it, or pass it to `Context.cancel`.

    Args:
        domain: who defined the code, e.g. "com.example.echo-python".
        code: a 64-bit integer within the domain.
        message: a human-readable explanation.
    """

    def __init__(self, domain, code, message):
        super().__init__(domain, code, message)
        self.domain = domain
        self.code = code
        self.message = message

    def __str__(self):
        return "%s %s: %s" % (self.domain, self.code, self.message)


class HostCallError(ExtensionError):
    """A host call (`Context.call_host`) failed: the app's error, or the runtime's own.

    Domain "SDKHost": 1 the host cancelled the request, 10 the service is not in the manifest's HostServices,
    11 the app provides no such service, 12 the request ended on the host, 13 the app's handler failed,
    14 the app has gone, 15 the answer is too large, 16 the call cannot be forwarded. Domain "SDKExtension":
    4 more than SDKHOST_MAX_HOST_CALLS calls waiting, 5 the request has ended, 7 the call is too large to send.
    Any other: the app's handler threw that error.
    """


_CANCELLED_BY_HOST = ("SDKHost", 1, "cancelled by the host")


def _request_ended():
    return HostCallError("SDKExtension", 5, "the request has ended")


class _ProtocolError(Exception):
    """The host broke the protocol: the worker logs it and exits 2."""


class _PlistError(Exception):
    """A payload that is not a valid bplist00."""


class _TooLarge(Exception):
    """A frame over MAX_FRAME_BYTES."""


# MARK: - bplist00


class _PlistDate(datetime.datetime):
    """A date as it came off the wire: a naive UTC datetime that also keeps the exact seconds since 2001, so a
    date sent back unchanged is the same double (datetime holds microseconds only)."""

    __slots__ = ("_seconds",)


_REFERENCE_DATE = datetime.datetime(2001, 1, 1)
_UTC = datetime.timezone.utc
_UNSET = object()
_UINT_FORMATS = {1: "B", 2: "H", 4: "I", 8: "Q"}


def _date_from_seconds(seconds):
    try:
        dt = _REFERENCE_DATE + datetime.timedelta(seconds=seconds)
    except (OverflowError, ValueError):
        # NaN, infinities and years outside 1...9999: the nearest datetime, the exact value kept for the way back.
        dt = datetime.datetime.max if seconds > 0 else datetime.datetime.min
    d = _PlistDate(dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second, dt.microsecond)
    d._seconds = seconds
    return d


def _date_seconds(d):
    if type(d) is _PlistDate:
        exact = getattr(d, "_seconds", None)
        if exact is not None:
            return exact
    if d.tzinfo is not None and d.utcoffset() is not None:
        d = d.astimezone(_UTC).replace(tzinfo=None)
    return (d.replace(tzinfo=None) - _REFERENCE_DATE).total_seconds()


def _uints(data, position, size, count):
    fmt = _UINT_FORMATS.get(size)
    if fmt is not None:
        return struct.unpack_from(">%d%s" % (count, fmt), data, position)
    return [int.from_bytes(data[position + i * size:position + (i + 1) * size], "big") for i in range(count)]


def _decode_plist(data):
    """The value a bplist00 payload holds. Every offset, reference and count is checked before use; shared
    objects are decoded once; cycles and nesting past MAX_DEPTH are errors.

    Raises:
        _PlistError: the payload is not a valid bplist00 of the kinds the protocol allows.
    """
    try:
        return _decode_plist_unchecked(data)
    except _PlistError:
        raise
    except (struct.error, IndexError, ValueError, UnicodeDecodeError, RecursionError, OverflowError) as e:
        raise _PlistError("%s: %s" % (type(e).__name__, e))


def _decode_plist_unchecked(data):
    size = len(data)
    if size < 41:
        if size >= 8 and data[:8] != b"bplist00":
            raise _PlistError("payload does not start with bplist00")
        raise _PlistError("payload is %d bytes; a bplist needs at least 41" % size)
    if data[:8] != b"bplist00":
        raise _PlistError("payload does not start with bplist00")
    t = size - 32
    offset_size = data[t + 6]
    ref_size = data[t + 7]
    count, top, table = struct.unpack_from(">QQQ", data, t + 8)
    if not (1 <= offset_size <= 8 and 1 <= ref_size <= 8):
        raise _PlistError("offset size %d / reference size %d not in 1...8" % (offset_size, ref_size))
    if count < 1 or count > (4 << 20):
        raise _PlistError("object count %d not in 1...%d" % (count, 4 << 20))
    if top >= count:
        raise _PlistError("top object %d >= object count %d" % (top, count))
    if table < 9 or table > t or count > (t - table) // offset_size:
        raise _PlistError("offset table at %d with %d entries does not fit before the trailer" % (table, count))
    if ref_size < 8 and (1 << (ref_size * 8)) < count:
        raise _PlistError("%d objects cannot be addressed with %d-byte references" % (count, ref_size))
    offsets = _uints(data, table, offset_size, count)
    end = table
    objects = [_UNSET] * count
    on_path = bytearray(count)

    def need(start, length, index):
        if length < 0 or start > end or length > end - start:
            raise _PlistError("object %d needs %d bytes at %d, past the object area" % (index, length, start))

    def length_of(low, off, index):
        if low != 15:
            return low, off + 1
        need(off + 1, 1, index)
        marker = data[off + 1]
        if marker >> 4 != 1 or marker & 15 > 3:
            raise _PlistError("object %d: length marker 0x%02x is not an integer" % (index, marker))
        width = 1 << (marker & 15)
        need(off + 2, width, index)
        n = int.from_bytes(data[off + 2:off + 2 + width], "big")
        if n > end:
            raise _PlistError("object %d: length %d exceeds the payload" % (index, n))
        return n, off + 2 + width

    def refs(start, n):
        out = _uints(data, start, ref_size, n)
        for r in out:
            if r >= count:
                raise _PlistError("reference %d >= object count %d" % (r, count))
        return out

    def value(index, depth):
        v = objects[index]
        if v is not _UNSET:
            return v
        off = offsets[index]
        if off < 8 or off >= end:
            raise _PlistError("object %d has offset %d outside 8..<%d" % (index, off, end))
        marker = data[off]
        kind = marker >> 4
        low = marker & 15
        if kind == 0x0:
            if low == 8:
                v = False
            elif low == 9:
                v = True
            else:
                raise _PlistError("object %d: marker 0x%02x (null/fill) is not allowed" % (index, marker))
        elif kind == 0x1:
            if low > 4:
                raise _PlistError("object %d: integer size nibble %d" % (index, low))
            width = 1 << low
            need(off + 1, width, index)
            if width == 8:
                v = struct.unpack_from(">q", data, off + 1)[0]
            elif width == 16:
                v = int.from_bytes(data[off + 1:off + 17], "big", signed=True)
                if not -(1 << 63) <= v < (1 << 63):
                    raise _PlistError("object %d: 128-bit integer outside 64 bits" % index)
            else:
                v = int.from_bytes(data[off + 1:off + 1 + width], "big")
        elif kind == 0x2:
            if low == 2:
                need(off + 1, 4, index)
                v = struct.unpack_from(">f", data, off + 1)[0]
            elif low == 3:
                need(off + 1, 8, index)
                v = struct.unpack_from(">d", data, off + 1)[0]
            else:
                raise _PlistError("object %d: real size nibble %d" % (index, low))
        elif marker == 0x33:
            need(off + 1, 8, index)
            v = _date_from_seconds(struct.unpack_from(">d", data, off + 1)[0])
        elif kind == 0x4:
            n, start = length_of(low, off, index)
            need(start, n, index)
            v = bytes(data[start:start + n])
        elif kind == 0x5:
            n, start = length_of(low, off, index)
            need(start, n, index)
            v = data[start:start + n].decode("ascii")
        elif kind == 0x6:
            n, start = length_of(low, off, index)
            need(start, 2 * n, index)
            v = data[start:start + 2 * n].decode("utf-16-be", "surrogatepass")
        elif kind == 0xA or kind == 0xD:
            n, start = length_of(low, off, index)
            need(start, n * ref_size * (2 if kind == 0xD else 1), index)
            if depth >= MAX_DEPTH:
                raise _PlistError("object %d: nesting deeper than the limit of %d" % (index, MAX_DEPTH))
            if on_path[index]:
                raise _PlistError("object %d contains itself" % index)
            on_path[index] = 1
            if kind == 0xA:
                v = []
                for r in refs(start, n):
                    v.append(value(r, depth + 1))
            else:
                v = {}
                keys = refs(start, n)
                values = refs(start + n * ref_size, n)
                for i in range(n):
                    key = value(keys[i], depth + 1)
                    if type(key) is not str:
                        raise _PlistError("object %d: key %d is not a string" % (index, i))
                    v[key] = value(values[i], depth + 1)
            on_path[index] = 0
        else:
            raise _PlistError("object %d: marker 0x%02x (UID, set or unknown) is not allowed" % (index, marker))
        objects[index] = v
        return v

    return value(top, 0)


def _length_header(marker, n):
    if n < 15:
        return bytes((marker | n,))
    if n < 0x100:
        return bytes((marker | 15, 0x10, n))
    if n < 0x10000:
        return bytes((marker | 15, 0x11)) + struct.pack(">H", n)
    if n < 0x100000000:
        return bytes((marker | 15, 0x12)) + struct.pack(">I", n)
    return bytes((marker | 15, 0x13)) + struct.pack(">Q", n)


def _encoded_int(v):
    if 0 <= v < 0x100:
        return bytes((0x10, v))
    if 0 <= v < 0x10000:
        return b"\x11" + struct.pack(">H", v)
    if 0 <= v < 0x100000000:
        return b"\x12" + struct.pack(">I", v)
    if -(1 << 63) <= v < (1 << 63):
        return b"\x13" + struct.pack(">q", v)
    raise ValueError("integer %d does not fit in 64 bits" % v)


def _encoded_str(v):
    if v.isascii():
        b = v.encode("ascii")
        return _length_header(0x50, len(b)) + b
    b = v.encode("utf-16-be", "surrogatepass")
    return _length_header(0x60, len(b) // 2) + b


def _width(n):
    return 1 if n < 0x100 else 2 if n < 0x10000 else 4 if n < 0x100000000 else 8


def _encode_plist(root, out):
    """Appends the bplist00 encoding of `root` to the bytearray `out`. Strings and integers are written once
    however often they occur, and a container that occurs twice is written once (so a shared value never grows).

    Raises:
        TypeError: a value of a kind the protocol cannot carry, or a dictionary key that is not a string.
        ValueError: an integer outside 64 bits, nesting deeper than MAX_DEPTH, or a container holding itself.
    """
    objects = []  # bytes (a scalar, encoded), list (an array's refs) or tuple (a dictionary's key and value refs)
    strings = {}
    integers = {}
    containers = {}
    on_path = set()

    def add(v, depth):
        t = type(v)
        if t is str or isinstance(v, str):
            v = str(v)
            i = strings.get(v)
            if i is None:
                i = strings[v] = len(objects)
                objects.append(_encoded_str(v))
            return i
        if t is bool:
            objects.append(b"\x09" if v else b"\x08")
            return len(objects) - 1
        if t is int or isinstance(v, int):
            v = int(v)
            i = integers.get(v)
            if i is None:
                i = integers[v] = len(objects)
                objects.append(_encoded_int(v))
            return i
        if t is float or isinstance(v, float):
            objects.append(b"\x23" + struct.pack(">d", v))
            return len(objects) - 1
        if isinstance(v, datetime.datetime):
            objects.append(b"\x33" + struct.pack(">d", _date_seconds(v)))
            return len(objects) - 1
        if isinstance(v, (bytes, bytearray, memoryview)):
            b = bytes(v)
            objects.append(_length_header(0x40, len(b)) + b)
            return len(objects) - 1
        if isinstance(v, (list, tuple, dict)):
            key = id(v)
            i = containers.get(key)
            if i is not None:
                if key in on_path:
                    raise ValueError("a value contains itself")
                return i
            if depth >= MAX_DEPTH:
                raise ValueError("values nested deeper than %d" % MAX_DEPTH)
            i = containers[key] = len(objects)
            objects.append(None)
            on_path.add(key)
            if isinstance(v, dict):
                key_refs = []
                value_refs = []
                for k, x in v.items():
                    if not isinstance(k, str):
                        raise TypeError("dictionary keys must be strings, not %s" % type(k).__name__)
                    key_refs.append(add(k, depth + 1))
                    value_refs.append(add(x, depth + 1))
                objects[i] = (key_refs, value_refs)
            else:
                element_refs = []
                for x in v:
                    element_refs.append(add(x, depth + 1))
                objects[i] = element_refs
            on_path.discard(key)
            return i
        raise TypeError("a %s cannot be sent (str, int, float, bool, datetime, bytes, list, dict)" % t.__name__)

    add(root, 0)
    count = len(objects)
    ref_size = _width(count)
    ref_format = _UINT_FORMATS[ref_size]
    start = len(out)
    out += b"bplist00"
    offsets = []
    for o in objects:
        offsets.append(len(out) - start)
        t = type(o)
        if t is bytes:
            out += o
        elif t is list:
            out += _length_header(0xA0, len(o))
            if o:
                out += struct.pack(">%d%s" % (len(o), ref_format), *o)
        else:
            out += _length_header(0xD0, len(o[0]))
            if o[0]:
                out += struct.pack(">%d%s" % (2 * len(o[0]), ref_format), *(o[0] + o[1]))
    table = len(out) - start
    offset_size = _width(table)
    out += struct.pack(">%d%s" % (count, _UINT_FORMATS[offset_size]), *offsets)
    out += bytes((0, 0, 0, 0, 0, 0, offset_size, ref_size))
    out += struct.pack(">QQQ", count, 0, table)


# MARK: - Files


def _memfd(name):
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    try:
        # MFD_NOEXEC_SEAL (Linux 6.3): the strict sandbox refuses a memfd without it; older kernels say EINVAL.
        return os.memfd_create(name, flags | 0x8)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return os.memfd_create(name, flags)


_F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
_F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
_SNAPSHOT_SEALS = getattr(fcntl, "F_SEAL_WRITE", 8) | getattr(fcntl, "F_SEAL_GROW", 4) | getattr(fcntl, "F_SEAL_SHRINK", 2)
_ALL_SEALS = _SNAPSHOT_SEALS | getattr(fcntl, "F_SEAL_SEAL", 1)
_O_PATH = getattr(os, "O_PATH", 0o10000000)


def _seals(fd):
    try:
        return fcntl.fcntl(fd, _F_GET_SEALS)
    except OSError:
        return -1


def _is_memfd(fd):
    try:
        return os.readlink("/proc/self/fd/%d" % fd).startswith("/memfd:")
    except OSError:
        return False


def _not_a_snapshot(fd):
    """Why `fd` cannot travel as an attachment, or None: it must be a regular file open read-only, or a memfd
    sealed against writing, growing and shrinking (docs/PROTOCOL.md "Descriptors")."""
    try:
        st = os.fstat(fd)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError as e:
        return "not an open descriptor (%s)" % e.strerror
    if flags & _O_PATH:
        return "an O_PATH descriptor, not an open file"
    if not stat.S_ISREG(st.st_mode):
        kind = ("a socket" if stat.S_ISSOCK(st.st_mode) else "a pipe" if stat.S_ISFIFO(st.st_mode)
                else "a directory" if stat.S_ISDIR(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                or stat.S_ISBLK(st.st_mode) else "not a regular file")
        return "%s, not a regular file or memfd" % kind
    seals = _seals(fd)
    if seals >= 0 and seals & _SNAPSHOT_SEALS == _SNAPSHOT_SEALS:
        return None
    if _is_memfd(fd):
        return "a memfd not sealed against writing, growing and shrinking"
    return None if flags & os.O_ACCMODE == os.O_RDONLY else "open for writing; attachments are read-only"


class File:
    """An open, read-only file an item carries (`Item.files`), passed to and from the host as a descriptor, so
    its bytes never go through the socket.

    Files the host sent are closed by the runtime when their request has ended and its handler has returned
    (call `dup` to keep one longer). A File you make is yours: it closes when you call `close`, leave a `with`
    block or drop the last reference. Reads are positioned (`os.pread`), so they never move the offset that
    every copy of the descriptor shares.

    Args:
        fd: an open descriptor, which the File takes over. It must be a regular file open read-only or a memfd
            sealed against writing, growing and shrinking to be sent (`from_bytes`, `from_path` and `from_fd`
            make such files).
    """

    __slots__ = ("_fd", "_position", "__weakref__")

    def __init__(self, fd):
        if type(fd) is not int or fd < 0:
            raise ValueError("File needs an open descriptor, not %r" % (fd,))
        self._fd = fd
        self._position = 0

    @classmethod
    def from_bytes(cls, data, name="sdkhost-attachment"):
        """A new memfd holding `data`, sealed so that no process can change it.

        Args:
            data: bytes-like content.
            name: shows in /proc/<pid>/fd as memfd:<name>.
        Raises:
            OSError: the memfd cannot be made, written or sealed.
        """
        fd = _memfd(name)
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view):]
            fcntl.fcntl(fd, _F_ADD_SEALS, _ALL_SEALS)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    @classmethod
    def from_path(cls, path):
        """The file at `path`, opened read-only.

        Raises:
            OSError: it cannot be opened.
            ValueError: it is not a regular file.
        """
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ValueError("%s is not a regular file" % path)
        return cls(fd)

    @classmethod
    def from_fd(cls, fd):
        """A read-only File of what `fd` refers to; `fd` stays yours. A descriptor open read-only, or a sealed
        memfd, is duplicated; an unsealed memfd is copied into a sealed one; any other file is reopened read-only.

        Raises:
            OSError: `fd` is not open or cannot be reopened.
            ValueError: it is not a regular file.
        """
        st = os.fstat(fd)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        if not stat.S_ISREG(st.st_mode) or flags & _O_PATH:
            raise ValueError("descriptor %d is not an open regular file" % fd)
        seals = _seals(fd)
        if seals >= 0 and seals & _SNAPSHOT_SEALS == _SNAPSHOT_SEALS:
            return cls(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0))
        if _is_memfd(fd):
            data = bytearray()
            while len(data) < st.st_size:
                chunk = os.pread(fd, min(st.st_size - len(data), 1 << 20), len(data))
                if not chunk:
                    break
                data += chunk
            return cls.from_bytes(data)
        if flags & os.O_ACCMODE == os.O_RDONLY:
            return cls(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0))
        return cls(os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY))

    def fileno(self):
        """The descriptor, still owned by this File (do not close it).

        Raises:
            ValueError: the File is closed.
        """
        if self._fd < 0:
            raise ValueError("I/O operation on a closed sdkhost.File")
        return self._fd

    @property
    def closed(self):
        """True once `close` was called."""
        return self._fd < 0

    @property
    def size(self):
        """The file's size in bytes."""
        return os.fstat(self.fileno()).st_size

    def pread(self, size, offset):
        """Up to `size` bytes from `offset` (fewer only at the end of the file); the position is not moved."""
        fd = self.fileno()
        chunks = []
        got = 0
        while got < size:
            chunk = os.pread(fd, size - got, offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def read(self, size=-1):
        """Up to `size` bytes from the File's position (all the rest when `size` is negative), moving it on."""
        if size is None or size < 0:
            size = max(self.size - self._position, 0)
            data = self.pread(size, self._position)
            # The file may be longer than fstat said a moment ago (a regular file someone appends to).
            while True:
                more = self.pread(1 << 20, self._position + len(data))
                if not more:
                    break
                data += more
        else:
            data = self.pread(size, self._position)
        self._position += len(data)
        return data

    def seek(self, offset, whence=0):
        """Moves the position (whence 0: from the start, 1: from the position, 2: from the end); returns it."""
        base = 0 if whence == 0 else self._position if whence == 1 else self.size
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._position = base + offset
        return self._position

    def tell(self):
        """The position `read` continues from."""
        return self._position

    def dup(self):
        """A new File on the same open file, with a descriptor of its own (to keep beyond the request)."""
        return File(fcntl.fcntl(self.fileno(), fcntl.F_DUPFD_CLOEXEC, 0))

    def close(self):
        """Closes the descriptor; a second call does nothing."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        if self._fd < 0:
            return "File(closed)"
        try:
            return "File(fd %d, %d bytes)" % (self._fd, self.size)
        except OSError:
            return "File(fd %d)" % self._fd


# MARK: - Items


class Item:
    """One unit of input or output, modelled on NSExtensionItem.

    Args:
        title: a short title (str or None).
        text: the item's text (str or None).
        attachments: a list of values: str, int (64-bit), float, bool, datetime, bytes, list and dict with str
            keys (naive datetimes are UTC; dates arrive as naive UTC datetimes).
        user_info: a dict of such values by str key.
        files: a list of `File`s, passed as descriptors (at most 64 per message, all items together).
    """

    __slots__ = ("title", "text", "attachments", "user_info", "files")

    def __init__(self, title=None, text=None, attachments=None, user_info=None, files=None):
        self.title = title
        self.text = text
        self.attachments = [] if attachments is None else attachments
        self.user_info = {} if user_info is None else user_info
        self.files = [] if files is None else files

    def __eq__(self, other):
        if not isinstance(other, Item):
            return NotImplemented
        return (self.title == other.title and self.text == other.text and self.attachments == other.attachments
                and self.user_info == other.user_info and list(self.files) == list(other.files))

    __hash__ = None

    def __repr__(self):
        parts = []
        for name in ("title", "text"):
            value = getattr(self, name)
            if value is not None:
                parts.append("%s=%r" % (name, value if len(value) <= 60 else value[:59] + "\u2026"))
        if self.attachments:
            parts.append("attachments=<%d values>" % len(self.attachments))
        if self.user_info:
            parts.append("user_info=<keys %s>" % ", ".join(sorted(map(str, self.user_info))))
        if self.files:
            parts.append("files=%r" % (list(self.files),))
        return "Item(%s)" % ", ".join(parts)


def _items_plist(items, files):
    """The wire form of `items`, their Files appended to `files` and numbered in order."""
    if isinstance(items, Item):
        raise TypeError("items must be a list of sdkhost.Item, not one Item")
    out = []
    for item in items:
        if not isinstance(item, Item):
            raise TypeError("items must be sdkhost.Item, not %s" % type(item).__name__)
        if not isinstance(item.attachments, (list, tuple)):
            raise TypeError("Item.attachments must be a list, not %s" % type(item.attachments).__name__)
        if not isinstance(item.user_info, dict):
            raise TypeError("Item.user_info must be a dict, not %s" % type(item.user_info).__name__)
        d = {"attachments": item.attachments, "userInfo": item.user_info}
        for name in ("title", "text"):
            value = getattr(item, name)
            if value is not None:
                if not isinstance(value, str):
                    raise TypeError("Item.%s must be a str or None, not %s" % (name, type(value).__name__))
                d[name] = value
        if item.files:
            indices = []
            for f in item.files:
                if not isinstance(f, File):
                    raise TypeError("Item.files must hold sdkhost.File, not %s" % type(f).__name__)
                indices.append(len(files))
                files.append(f)
            d["files"] = indices
        out.append(d)
    return out


def _items_from_plist(message, files):
    """The items of a received message; `files` are the Files its frame brought."""
    raw = message.get("items")
    if type(raw) is not list:
        raise _ProtocolError("'%s' needs an array 'items'" % message["type"])
    items = []
    for d in raw:
        if type(d) is not dict:
            raise _ProtocolError("item is a %s, not a dictionary" % type(d).__name__)
        title = d.get("title")
        text = d.get("text")
        attachments = d.get("attachments", [])
        user_info = d.get("userInfo", {})
        indices = d.get("files", [])
        if (title is not None and type(title) is not str) or (text is not None and type(text) is not str):
            raise _ProtocolError("item title and text must be strings")
        if type(attachments) is not list or type(user_info) is not dict or type(indices) is not list:
            raise _ProtocolError("item attachments, userInfo and files must be an array, a dictionary, an array")
        item_files = []
        for i in indices:
            if type(i) is not int or not 0 <= i < len(files):
                raise _ProtocolError("item files entry %r does not name one of the message's %d descriptor(s)"
                                     % (i, len(files)))
            item_files.append(files[i])
        items.append(Item(title, text, attachments, user_info, item_files))
    return items


def _frame(message, files=()):
    """A whole frame (header and bplist00 payload) for `message`, with the descriptors to attach to it.

    Raises:
        TypeError, ValueError: a value that cannot be sent, a closed File or one that is not a read-only snapshot,
            more than 64 Files.
        _TooLarge: the payload is over MAX_FRAME_BYTES.
    """
    fds = []
    if files:
        if len(files) > MAX_DESCRIPTORS:
            raise ValueError("%d files in one message; at most %d" % (len(files), MAX_DESCRIPTORS))
        for f in files:
            fd = f.fileno()
            problem = _not_a_snapshot(fd)
            if problem:
                raise ValueError("%r cannot be sent: %s" % (f, problem))
            fds.append(fd)
        message["fds"] = len(fds)
    out = bytearray(4)
    _encode_plist(message, out)
    length = len(out) - 4
    if length > MAX_FRAME_BYTES:
        raise _TooLarge("frame payload of %d bytes exceeds the limit of %d" % (length, MAX_FRAME_BYTES))
    struct.pack_into(">I", out, 0, length)
    return out, fds


# MARK: - The connection


class _Connection:
    """The host connection's writing side: whole frames, under one lock, from any thread."""

    def __init__(self, sock):
        self.sock = sock
        self.lock = threading.Lock()

    def write(self, frame, fds=()):
        with self.lock:
            try:
                if fds:
                    # The descriptors ride on the frame's first byte; the rest may follow in later writes.
                    sent = self.sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                    if sent < len(frame):
                        self.sock.sendall(memoryview(frame)[sent:])
                else:
                    self.sock.sendall(frame)
            except OSError as e:
                _log("host connection lost: %s" % e)
                _exit(0)

    def send(self, message):
        """Sends a small control message (no items, no files)."""
        self.write(_frame(message)[0])


# MARK: - Host calls


class _HostCaller:
    """The calls of this worker's requests to the host's services. Call numbers are unique per worker, so an
    answer names one call only; each call ends exactly once (answer, error, give-up or its request's end)."""

    def __init__(self, connection, max_in_flight):
        self.connection = connection
        self.max_in_flight = max_in_flight
        self.lock = threading.Lock()
        self.numbers = itertools.count(1)
        self.waiting = {}  # call -> (context, resolve)

    def start(self, ctx, service, items, resolve):
        """Sends the call; `resolve(outcome)` runs exactly once, perhaps before this returns, with ("ok", items)
        or ("error", exception). Returns the call's number, or None when it ended at once."""
        if not isinstance(service, str):
            raise TypeError("service must be a str, not %s" % type(service).__name__)
        call = next(self.numbers)
        files = []
        message = {"type": "hostCall", "id": ctx.request_id, "call": call, "service": service,
                   "items": _items_plist(items, files)}
        try:
            frame, fds = _frame(message, files)
        except _TooLarge as e:
            _log("cannot send 'hostCall' to %s: %s" % (service, e))
            resolve(("error", HostCallError("SDKExtension", 7, "the call cannot be sent (too large for a frame)")))
            return None
        failure = None
        # Under the request's lock, so that the call goes out before the request's end, or not at all.
        with ctx._lock:
            if ctx._cancelled:
                failure = HostCallError(*_CANCELLED_BY_HOST)
            elif ctx._finished:
                failure = _request_ended()
            else:
                with self.lock:
                    if ctx._calls_in_flight >= self.max_in_flight:
                        failure = HostCallError("SDKExtension", 4, "more than %d host calls in flight "
                                                "(MaxHostCallsInFlight)" % self.max_in_flight)
                    else:
                        ctx._calls_in_flight += 1
                        self.waiting[call] = (ctx, resolve)
                if failure is None:
                    self.connection.write(frame, fds)
        if failure is not None:
            resolve(("error", failure))
            return None
        return call

    def _take(self, call):
        with self.lock:
            entry = self.waiting.pop(call, None)
            if entry is not None:
                entry[0]._calls_in_flight -= 1
            return entry

    def answer(self, call, outcome, files):
        """The host answered. An answer for a call no longer waited for is dropped, its files closed."""
        entry = self._take(call)
        if entry is None:
            for f in files:
                f.close()
            return
        ctx, resolve = entry
        ctx._adopt_files(files)
        resolve(outcome)

    def give_up(self, call):
        """The extension stopped waiting for `call` (a timeout, its Task cancelled): the host is told. Returns
        False when the call had ended already (its outcome is on its way to the waiter)."""
        entry = self._take(call)
        if entry is None:
            return False
        self.connection.send({"type": "hostCallCancel", "id": entry[0].request_id, "call": call})
        return True

    def end(self, ctx, cancelled):
        """The request ended: its waiting calls fail. `cancelled`: the host cancelled it, and still runs its
        calls until it hears hostCallCancel for each."""
        with self.lock:
            mine = sorted((call, entry[1]) for call, entry in self.waiting.items() if entry[0] is ctx)
            for call, _ in mine:
                del self.waiting[call]
            ctx._calls_in_flight = 0
        for call, resolve in mine:
            if cancelled:
                self.connection.send({"type": "hostCallCancel", "id": ctx.request_id, "call": call})
            resolve(("error", HostCallError(*_CANCELLED_BY_HOST) if cancelled else _request_ended()))


def _outcome(outcome):
    kind, value = outcome
    if kind == "ok":
        return value
    raise value


def _settle(future, value):
    if not future.done():
        future.set_result(value)


def _call_soon(loop, callback, *args):
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass  # the loop is closed: nobody waits any more


# MARK: - The request's context


class Context:
    """One request as the extension sees it: its input, its cancellation, and the means to finish it.

    Finishing is idempotent: the first `complete` or `cancel` wins; later ones are logged and ignored. Every
    method may be called from any thread.

    Attributes:
        request_id: the request's id (a UUID string) as the host knows it.
        input_items: the `Item`s the host sent.
    """

    def __init__(self, runtime, request_id, input_items, files):
        self.request_id = request_id
        self.input_items = input_items
        self._runtime = runtime
        self._lock = threading.Lock()
        self._finished = False
        self._cancelled = False
        self._cancel_event = None
        self._credits = STREAM_WINDOW
        self._credit_waiters = []
        self._task = None
        self._loop = None
        self._calls_in_flight = 0
        self._files = list(files)
        self._handler_done = False
        self._released = False

    def __repr__(self):
        state = "finished" if self._finished else "cancelled by the host" if self._cancelled else "running"
        return "Context(%s, %d items, %s)" % (self.request_id, len(self.input_items), state)

    @property
    def cancelled(self):
        """True once the host has cancelled this request (the app gave up, or its deadline passed). Long work
        should check it and stop, ending with `cancel(...)`. Async handlers also get Task cancellation."""
        return self._cancelled

    @property
    def finished(self):
        """True once `complete` or `cancel` was called."""
        return self._finished

    def wait_cancelled(self, timeout=None):
        """Blocks until the host cancels this request, or `timeout` seconds pass.

        Returns:
            True if the request was cancelled by the host.
        """
        with self._lock:
            if self._cancelled:
                return True
            if self._cancel_event is None:
                self._cancel_event = threading.Event()
            event = self._cancel_event
        return event.wait(timeout)

    def complete(self, items=()):
        """Completes the request with `items` (a list of `Item`). A second call, or one after `cancel`, is logged
        and ignored. A reply over the 16 MiB frame limit ends the request cancelled
        {SDKExtension, 3, "reply too large: ..."} instead.

        Raises:
            TypeError, ValueError: an item holds a value that cannot be sent (the request stays open).
        """
        if self._finished:
            return _log("complete on request %s that already finished; ignored" % self.request_id)
        files = []
        message = {"type": "complete", "id": self.request_id, "items": _items_plist(items, files)}
        try:
            frame, fds = _frame(message, files)
        except _TooLarge as e:
            _log("reply to %s too large: %s" % (self.request_id, e))
            frame, fds = self._cancelled_frame("SDKExtension", 3, "reply too large: %s" % e), []
        self._finish(frame, fds, "complete")

    def cancel(self, domain, code=0, message=""):
        """Ends the request cancelled, reporting the error to the app. Ignored (and logged) if it already
        finished.

        Args:
            domain: the error's domain (str), or an `ExtensionError`, whose fields are then used.
            code: a 64-bit integer.
            message: a human-readable explanation.
        """
        if isinstance(domain, ExtensionError):
            domain, code, message = domain.domain, domain.code, domain.message
        if self._finished:
            return _log("cancel on request %s that already finished; ignored" % self.request_id)
        if not isinstance(domain, str) or not isinstance(message, str) or not isinstance(code, int) or code is True \
                or code is False:
            raise TypeError("cancel(domain: str, code: int, message: str)")
        self._finish(self._cancelled_frame(domain, code, message[:1 << 20]), [], "cancel")

    def _cancelled_frame(self, domain, code, message):
        error = {"domain": domain, "code": code, "message": message}
        return _frame({"type": "cancelled", "id": self.request_id, "error": error})[0]

    def _finish(self, frame, fds, verb):
        with self._lock:
            if self._finished:
                return _log("%s on request %s that already finished; ignored" % (verb, self.request_id))
            self._finished = True
            self._runtime._ended(self)
            self._runtime.connection.write(frame, fds)
        self._wake_senders()
        # Its waiting calls end now; the host cancels them on its side when it reads the reply.
        self._runtime.caller.end(self, cancelled=False)
        self._release_if_done()

    # Partial results

    def _take_credit(self, waiter):
        """One credit ("granted"), or "ended", or "wait" with `waiter` registered for the next credit or end."""
        with self._lock:
            if self._finished or self._cancelled:
                return "ended"
            if self._credits > 0:
                self._credits -= 1
                return "granted"
            if waiter is not None:
                self._credit_waiters.append(waiter)
            return "wait"

    def _send_partial(self, items):
        """Sends one partial result, its credit taken; gives the credit back when nothing is sent."""
        files = []
        try:
            message = {"type": "partial", "id": self.request_id, "items": _items_plist(items, files)}
            frame, fds = _frame(message, files)
        except _TooLarge as e:
            _log("partial result of %s too large: %s; dropped" % (self.request_id, e))
            self._credit(1)
            return False
        except BaseException:
            self._credit(1)
            raise
        with self._lock:
            if self._finished or self._cancelled:
                return self._dropped()
            self._runtime.connection.write(frame, fds)
        return True

    def _dropped(self):
        _log("send on request %s that has finished or was cancelled; dropped" % self.request_id)
        return False

    def send(self, items):
        """Sends `items` (a list of `Item`) to the app as a partial result, before the request ends. Blocks this
        thread while the app has 16 earlier ones it has not taken. From an async handler use `send_async`.

        Returns:
            True when sent; False, dropping the items, when the request has finished or was cancelled.
        Raises:
            TypeError, ValueError: an item holds a value that cannot be sent.
        """
        state = self._take_credit(None)
        while state == "wait":
            event = threading.Event()
            state = self._take_credit(event)
            if state == "wait":
                event.wait()
                state = self._take_credit(None)
        return self._send_partial(items) if state == "granted" else self._dropped()

    async def send_async(self, items):
        """The async form of `send`: suspends while the app has 16 earlier partial results it has not taken.

        Returns:
            True when sent; False, dropping the items, when the request has finished or was cancelled.
        """
        state = self._take_credit(None)
        if state == "wait":
            import asyncio
            loop = asyncio.get_running_loop()
            while state == "wait":
                future = loop.create_future()
                state = self._take_credit((loop, future))
                if state == "wait":
                    await future
                    state = self._take_credit(None)
        return self._send_partial(items) if state == "granted" else self._dropped()

    def _credit(self, count):
        with self._lock:
            self._credits = min(self._credits + max(count, 0), STREAM_WINDOW)
        self._wake_senders()

    def _wake_senders(self):
        with self._lock:
            waiters, self._credit_waiters = self._credit_waiters, []
        for waiter in waiters:
            if isinstance(waiter, tuple):
                _call_soon(waiter[0], _settle, waiter[1], None)
            else:
                waiter.set()

    # Host calls

    def call_host(self, service, items=(), timeout=None):
        """Asks the app's service `service` (listed in the manifest's HostServices) with `items`, and waits on
        this thread for its answer. Items may carry files both ways. From an async handler use
        `call_host_async`.

        Args:
            service: the service's name.
            items: a list of `Item`.
            timeout: seconds to wait, or None for as long as the request lasts. Giving up tells the host
                (hostCallCancel), which cancels the app's handler.
        Returns:
            The app's items (a list of `Item`).
        Raises:
            HostCallError: the app's error or the runtime's (see HostCallError); {SDKHost, 1} when the host
                cancelled the request meanwhile.
            TimeoutError: `timeout` passed.
        """
        done = threading.Event()
        box = []

        def resolve(outcome):
            box.append(outcome)
            done.set()

        call = self._runtime.caller.start(self, service, items, resolve)
        if not done.wait(timeout):
            if self._runtime.caller.give_up(call):
                raise TimeoutError("host call to '%s' timed out after %s s" % (service, timeout))
            done.wait()
        return _outcome(box[0])

    async def call_host_async(self, service, items=(), timeout=None):
        """The async form of `call_host`. Cancelling the calling Task (as a host cancel of the request does)
        gives the call up too, and the app's handler is cancelled.

        Raises:
            HostCallError: as `call_host`.
            TimeoutError: `timeout` passed.
            asyncio.CancelledError: the calling Task was cancelled.
        """
        import asyncio
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        call = self._runtime.caller.start(self, service, items, lambda outcome: _call_soon(loop, _settle, future, outcome))
        try:
            if timeout is None:
                outcome = await future
            else:
                outcome = await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            if call is not None:
                self._runtime.caller.give_up(call)
            raise TimeoutError("host call to '%s' timed out after %s s" % (service, timeout)) from None
        except asyncio.CancelledError:
            if call is not None:
                self._runtime.caller.give_up(call)
            raise
        return _outcome(outcome)

    # The runtime's side

    def _host_cancelled(self):
        """The host cancelled: raise the flag, cancel the handler's Task, wake whoever waits for credit or for
        host calls."""
        with self._lock:
            if self._cancelled or self._finished:
                return
            self._cancelled = True
            event, task, loop = self._cancel_event, self._task, self._loop
        if event is not None:
            event.set()
        if task is not None:
            _call_soon(loop, task.cancel)
        self._wake_senders()
        self._runtime.caller.end(self, cancelled=True)

    def _attach(self, task, loop):
        with self._lock:
            self._task, self._loop = task, loop
            cancelled = self._cancelled
        if cancelled:
            task.cancel()

    def _adopt_files(self, files):
        """Files the host sent for this request (a host call's answer): closed with the input's."""
        if not files:
            return
        with self._lock:
            if not self._released:
                self._files.extend(files)
                return
        for f in files:
            f.close()

    def _handler_returned(self):
        with self._lock:
            self._handler_done = True
        self._release_if_done()

    def _release_if_done(self):
        """Once the request has ended and its handler returned, the descriptors the host sent are closed."""
        with self._lock:
            if self._released or not (self._finished and self._handler_done):
                return
            self._released = True
            files, self._files = self._files, []
            self._task = None
        for f in files:
            f.close()


# MARK: - Where handlers run


class _Pool:
    """Threads for synchronous handlers: an idle one takes the next job, and a new one starts (up to `limit`)
    when none is idle, since handlers may block for as long as their request lasts."""

    def __init__(self, limit=256):
        import queue
        self.jobs = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = 0
        self.threads = 0
        self.limit = limit

    def submit(self, job, *args):
        """Queues `job(*args)`; False when no thread can run it (none could be started, under the worker's memory
        or thread limit, and none exists): the caller ends that request, and the worker serves on."""
        with self.lock:
            if self.idle > 0:
                self.idle -= 1
                start = False
            else:
                start = self.threads < self.limit
                if start:
                    self.threads += 1
            number = self.threads
        if start:
            try:
                threading.Thread(target=self._work, name="sdkhost-handler-%d" % number, daemon=True).start()
            except RuntimeError as error:
                # Out of address space or threads: go on with the threads there are (the job waits for one).
                with self.lock:
                    self.threads -= 1
                    self.limit = max(self.threads, 1)
                    alone = self.threads == 0
                _log("cannot start a handler thread (%s); %d running" % (error, number - 1))
                if alone:
                    return False
        self.jobs.put((job, args))
        return True

    def _work(self):
        while True:
            job, args = self.jobs.get()
            try:
                job(*args)
            except BaseException:
                import traceback
                _log("internal error in the sdkhost runtime:\n%s" % traceback.format_exc().rstrip())
            del job, args
            with self.lock:
                self.idle += 1


class _AsyncRunner:
    """One asyncio loop in a thread of its own, where async handlers run as Tasks."""

    def __init__(self):
        import asyncio
        self.asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        self.tasks = set()
        threading.Thread(target=self._main, name="sdkhost-asyncio", daemon=True).start()

    def _main(self):
        self.asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self, ctx, coroutine):
        _call_soon(self.loop, self._create, ctx, coroutine)

    def _create(self, ctx, coroutine):
        task = self.loop.create_task(coroutine)
        self.tasks.add(task)  # the loop keeps only weak references to Tasks
        task.add_done_callback(self.tasks.discard)
        ctx._attach(task, self.loop)


def _is_async(function):
    code = getattr(function, "__code__", None)
    if code is not None:
        return bool(code.co_flags & 0x80)  # CO_COROUTINE
    import inspect
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(getattr(function, "__call__", None))


def _handler_failed(ctx, error):
    """A handler raised: the request, unless it finished, ends cancelled with the error."""
    if isinstance(error, ExtensionError):
        try:
            if not ctx.finished:
                ctx.cancel(error)
            return
        except (TypeError, ValueError):
            pass  # an ExtensionError with fields that cannot be sent: reported as any other exception
    import traceback
    _log("handler for request %s raised:\n%s" % (ctx.request_id, "".join(
        traceback.format_exception(type(error), error, error.__traceback__)).rstrip()))
    if not ctx.finished:
        ctx.cancel("SDKExtension", 8, "the handler raised %s: %s" % (type(error).__name__, error))


def _system_exit(error):
    code = error.code
    if code is None:
        _exit(0)
    if isinstance(code, int):
        _exit(code & 0xFF)
    _log(str(code))
    _exit(1)


# MARK: - Conformance


_CONFORMANCE_TITLE = "sdkhost.conformance"


def _conformance(ctx):
    """Answers a conformance request (docs/PROTOCOL.md "Conformance") whatever the extension's handler does."""
    command = ctx.input_items[0].text or ""
    if command == "echo":
        ctx.complete(ctx.input_items)
    elif command == "wait":
        ctx.wait_cancelled()
        ctx.cancel(*_CANCELLED_BY_HOST)
    elif command.startswith("stream:") and command[7:].isascii() and command[7:].isdigit():
        count = int(command[7:])
        for k in range(1, count + 1):
            if not ctx.send([Item(text=str(k))]):
                break
        if ctx.cancelled:
            ctx.cancel(*_CANCELLED_BY_HOST)
        else:
            ctx.complete([Item(text=str(count))])
    elif command == "files":
        try:
            reversed_files = []
            for item in ctx.input_items:
                for f in item.files:
                    reversed_files.append(File.from_bytes(f.pread(f.size, 0)[::-1], name="conformance-reversed"))
        except OSError as e:
            return ctx.cancel(_CONFORMANCE_TITLE, 3, "files: %s" % e)
        ctx.complete([Item(title="files", files=reversed_files)])
        for f in reversed_files:
            f.close()
    elif command.startswith("call:"):
        try:
            answer = ctx.call_host(command[5:], [Item(text="ping")])
        except ExtensionError as e:
            return ctx.cancel(e)
        except Exception as e:
            return ctx.cancel(_CONFORMANCE_TITLE, 4, "call: %s" % e)
        ctx.complete(answer)
    else:
        ctx.cancel(_CONFORMANCE_TITLE, 2, "unknown command %s" % command)


# MARK: - The runtime


_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_CARRIERS = frozenset(("begin", "complete", "partial", "hostCall", "hostCallResult"))
_KNOWN = frozenset((
    "hello", "welcome", "begin", "complete", "partial", "credit", "cancel", "cancelled", "ping", "pong", "error",
    "connect", "connected", "assigned", "interrupted", "status", "statusReport", "sandboxed", "launchFailed",
    "prewarm", "prewarmed", "leak", "subscribe", "event", "hostCall", "hostCallResult", "hostCallError",
    "hostCallCancel"))


def _field(message, key, kind):
    value = message.get(key)
    if type(value) is not kind:
        raise _ProtocolError("'%s' needs %s '%s'" % (message["type"], "an integer" if kind is int else "a string", key))
    return value


def _request_id(message):
    value = _field(message, "id", str)
    if not (len(value) == 36 and value[8] == value[13] == value[18] == value[23] == "-"
            and _HEX_DIGITS.issuperset(value[:8] + value[9:13] + value[14:18] + value[19:23] + value[24:])):
        raise _ProtocolError("'%s' id '%s' is not a UUID" % (message["type"], value[:64]))
    return value


def _env_int(name, default):
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


class _Runtime:
    def __init__(self, handler, sock):
        self.sock = sock
        self.identifier = os.environ.get("SDKHOST_EXTENSION_ID", "unknown")
        self.idle_ms = _env_int("SDKHOST_IDLE_TIMEOUT_MS", 0)
        max_calls = _env_int("SDKHOST_MAX_HOST_CALLS", 16)
        self.conformance = os.environ.get("SDKHOST_CONFORMANCE") == "1"
        self.connection = _Connection(sock)
        self.caller = _HostCaller(self.connection, max_calls if 1 <= max_calls <= 1024 else 16)
        self.registry = {}  # request id (upper case) -> Context, until the request ends
        self.registry_lock = threading.Lock()
        self.last_begin = time.monotonic()
        self.pool = _Pool()
        if not callable(handler) and callable(getattr(handler, "handle", None)):
            handler = handler.handle
        if not callable(handler):
            raise TypeError("sdkhost.run needs a handler: a function handle(ctx) or async def handle(ctx)")
        self.handler = handler
        self.runner = _AsyncRunner() if _is_async(handler) else None
        self.runner_lock = threading.Lock()
        self.dispatch = {
            "hello": self._hello, "begin": self._begin, "cancel": self._cancel, "credit": self._credit,
            "ping": self._ping, "hostCallResult": self._host_call_result, "hostCallError": self._host_call_error,
            "error": self._error,
        }

    def _ended(self, ctx):
        with self.registry_lock:
            if self.registry.get(ctx.request_id.upper()) is ctx:
                del self.registry[ctx.request_id.upper()]

    # The handlers' side

    def _run_sync(self, ctx, function):
        try:
            result = function(ctx)
            if result is not None and hasattr(result, "__await__"):
                # A callable that returned a coroutine: it runs as a Task after all.
                with self.runner_lock:
                    if self.runner is None:
                        self.runner = _AsyncRunner()
                self.runner.start(ctx, self._run_async(ctx, awaitable=result))
                return
        except SystemExit as e:
            _system_exit(e)
        except BaseException as e:
            _handler_failed(ctx, e)
        ctx._handler_returned()

    async def _run_async(self, ctx, function=None, awaitable=None):
        import asyncio
        try:
            if awaitable is None:
                awaitable = function(ctx)
            await awaitable
        except asyncio.CancelledError:
            if not ctx.finished:
                ctx.cancel(*_CANCELLED_BY_HOST)
        except SystemExit as e:
            _system_exit(e)
        except BaseException as e:
            _handler_failed(ctx, e)
        else:
            if not ctx.finished:
                if ctx.cancelled:
                    ctx.cancel(*_CANCELLED_BY_HOST)
                else:
                    _log("handler returned without finishing request %s" % ctx.request_id)
                    ctx.cancel("SDKExtension", 2, "the handler returned without completing the request")
        finally:
            ctx._handler_returned()

    # Messages from the host

    def _hello(self, message, files):
        version = _field(message, "version", int)
        _field(message, "identifier", str)
        _field(message, "hostPid", int)
        idle = _field(message, "idleTimeoutMs", int)
        if version != PROTOCOL_VERSION:
            _log("host speaks protocol %d, we speak %d; exiting" % (version, PROTOCOL_VERSION))
            _exit(_EX_PROTOCOL)
        self.idle_ms = idle
        self.last_begin = time.monotonic()
        self.connection.send({"type": "welcome", "version": PROTOCOL_VERSION, "identifier": self.identifier,
                              "pid": _PID})

    def _begin(self, message, files):
        request_id = _request_id(message)
        items = _items_from_plist(message, files)
        if "extension" in message:
            _field(message, "extension", str)
        if "deadlineMs" in message:
            _field(message, "deadlineMs", int)
        self.last_begin = time.monotonic()
        ctx = Context(self, request_id, items, files)
        with self.registry_lock:
            self.registry[request_id.upper()] = ctx
        if self.conformance and items and items[0].title == _CONFORMANCE_TITLE:
            queued = self.pool.submit(self._run_sync, ctx, _conformance)
        elif self.runner is not None:
            queued = True
            self.runner.start(ctx, self._run_async(ctx, self.handler))
        else:
            queued = self.pool.submit(self._run_sync, ctx, self.handler)
        if not queued:
            ctx.cancel("SDKExtension", 9, "no thread could be started for the handler")

    def _context(self, message):
        request_id = _request_id(message)
        with self.registry_lock:
            return self.registry.get(request_id.upper())

    def _cancel(self, message, files):
        ctx = self._context(message)
        if ctx is not None:
            ctx._host_cancelled()

    def _credit(self, message, files):
        count = _field(message, "count", int)
        ctx = self._context(message)
        if ctx is not None:
            ctx._credit(count)

    def _ping(self, message, files):
        self.connection.send({"type": "pong", "seq": _field(message, "seq", int)})

    def _host_call_result(self, message, files):
        _request_id(message)
        call = _field(message, "call", int)
        self.caller.answer(call, ("ok", _items_from_plist(message, files)), files)

    def _host_call_error(self, message, files):
        _request_id(message)
        call = _field(message, "call", int)
        error = message.get("error")
        if (type(error) is not dict or type(error.get("domain")) is not str or type(error.get("code")) is not int
                or type(error.get("message")) is not str):
            raise _ProtocolError("error must be {domain: string, code: integer, message: string}")
        self.caller.answer(call, ("error", HostCallError(error["domain"], error["code"], error["message"])), [])

    def _error(self, message, files):
        _field(message, "message", str)
        if "id" in message:
            _request_id(message)
        _log("host reported: %s" % message["message"][:4096])

    def _handle(self, payload, queued):
        try:
            message = _decode_plist(payload)
        except _PlistError as e:
            raise _ProtocolError("payload is not a valid bplist00: %s" % e)
        if type(message) is not dict:
            raise _ProtocolError("message is a %s, not a dictionary" % type(message).__name__)
        kind = message.get("type")
        if type(kind) is not str:
            raise _ProtocolError("message has no string 'type'")
        count = message.get("fds", 0)
        if type(count) is not int or count < 0:
            raise _ProtocolError("'fds' must be a non-negative integer")
        if count > MAX_DESCRIPTORS:
            raise _ProtocolError("message carries %d descriptors; at most %d are allowed" % (count, MAX_DESCRIPTORS))
        if count > len(queued):
            raise _ProtocolError("the frame says it carries %d descriptor(s), and %d arrived" % (count, len(queued)))
        files = [queued.popleft() for _ in range(count)]
        if files and kind not in _CARRIERS:
            raise _ProtocolError("'%s' cannot carry descriptors" % kind)
        handler = self.dispatch.get(kind)
        if handler is not None:
            handler(message, files)
            return
        for f in files:
            f.close()
        if kind in _KNOWN:
            _log("unexpected '%s' from host; ignored" % kind)
        else:
            _log("unknown message type '%s' from host; ignored" % kind[:200])

    def serve(self):
        """The main loop: read, frame, dispatch; answer pings; exit on EOF, protocol error or idle."""
        sock = self.sock
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        buffered = bytearray()
        queued = collections.deque()  # Files received and not yet claimed by a whole frame
        control_size = socket.CMSG_SPACE(MAX_DESCRIPTORS * 4)
        flags = socket.MSG_CMSG_CLOEXEC | socket.MSG_DONTWAIT
        while True:
            idle_ms = self.idle_ms
            if not poller.poll(min(idle_ms, 1000) if idle_ms > 0 else 1000):
                if (idle_ms > 0 and not self.registry
                        and time.monotonic() - self.last_begin > 2 * idle_ms / 1000.0):
                    _exit(0)
                continue
            try:
                data, ancillary, message_flags, _ = sock.recvmsg(65536, control_size, flags)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as e:
                _log("host connection lost: %s" % e)
                _exit(0)
            try:
                self._adopt(ancillary, message_flags, queued)
                if not data:
                    _exit(0)  # the host closed the connection
                buffered += data
                position = 0
                available = len(buffered)
                while available - position >= 4:
                    (length,) = struct.unpack_from(">I", buffered, position)
                    if length > MAX_FRAME_BYTES:
                        raise _ProtocolError("a frame of %d bytes exceeds the limit of %d" % (length, MAX_FRAME_BYTES))
                    if available - position - 4 < length:
                        break
                    payload = bytes(buffered[position + 4:position + 4 + length])
                    position += 4 + length
                    self._handle(payload, queued)
                if position:
                    del buffered[:position]
                if len(queued) > (MAX_DESCRIPTORS if buffered else 0):
                    raise _ProtocolError("%d descriptor(s) arrived that no frame claims" % len(queued))
            except _ProtocolError as e:
                _log("protocol error from host: %s; exiting" % e)
                _exit(_EX_PROTOCOL)
            except Exception:
                import traceback
                _log("internal error in the sdkhost runtime; exiting:\n%s" % traceback.format_exc().rstrip())
                _exit(70)

    @staticmethod
    def _adopt(ancillary, message_flags, queued):
        """Takes the descriptors that came with a read; every one is owned (and closed on exit) even when the
        read is refused."""
        problem = None
        if message_flags & socket.MSG_CTRUNC:
            problem = "a message brought more than %d descriptors, or control data other than descriptors" % MAX_DESCRIPTORS
        for level, kind, data in ancillary:
            if level != socket.SOL_SOCKET or kind != socket.SCM_RIGHTS:
                problem = problem or "control data other than descriptors"
                continue
            fds = array.array("i")
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
            for fd in fds:
                f = File(fd)
                queued.append(f)
                if problem is None:
                    why = _not_a_snapshot(fd)
                    if why is not None:
                        problem = "a descriptor attachment is %s" % why
        if problem is not None:
            raise _ProtocolError(problem)


def _host_socket():
    """The host connection, or a line on stderr and exit 64 when this process was not started by sdk-host."""
    fd = _env_int("SDKHOST_IPC_FD", 3)
    try:
        if fd < 0 or not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise OSError(errno.ENOTSOCK, "not a socket")
        sock = socket.socket(fileno=fd)
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            sock.detach()
            raise OSError(errno.ENOTSOCK, "not a Unix stream socket")
    except (OSError, ValueError, OverflowError):
        _log("no host connection on fd %d: this program is an sdk-host extension; run it through sdk-host" % fd)
        _exit(_EX_USAGE)
    sock.setblocking(True)
    return sock


def run(handler):
    """Runs the worker with `handler` until the host lets it go: never returns.

    Args:
        handler: `def handle(ctx)`, run on a pool thread for each request (it may block, and may finish the
            request later from another thread), or `async def handle(ctx)`, run as a Task on the runtime's
            asyncio loop (a host cancel cancels the Task; returning without finishing ends the request
            cancelled). An object with such a `handle` method works too. Each request must end with
            `ctx.complete(items)` or `ctx.cancel(...)`; a handler that raises ends it cancelled with the error
            (an `ExtensionError` as it is, anything else as {SDKExtension, 8}).
    """
    sock = _host_socket()
    global _PID
    _PID = os.getpid()
    try:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    except (ValueError, OSError):
        pass  # not the main thread: writes still raise EPIPE rather than kill
    # stdout is a pipe to the host log: one line at a time, so each print reaches the log as it is printed.
    if sys.stdout is not None and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 2000))
    runtime = _Runtime(handler, sock)
    try:
        runtime.serve()
    except KeyboardInterrupt:
        _exit(130)
    _exit(0)
