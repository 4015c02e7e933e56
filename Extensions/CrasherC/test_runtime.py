#!/usr/bin/env python3
"""test_runtime.py: checks the C runtime (Extensions/CRuntime) through the C Crasher, with no host.

    python3 test_runtime.py <path-to-built-CrasherC> [--valgrind] [--only SUBSTRING]

Spawns the worker directly, a socketpair on its descriptor 3, and speaks the worker protocol
(Sources/SDKWire/Messages.swift) with plistlib and a small bplist codec of its own (for bit-exact reals and dates
and for malformed payloads): handshake, heartbeat, every conformance command, cancel, credit, descriptors both
ways, host calls, leak reports, malformed and oversized frames, unknown types, EOF and the idle exit. Prints one
line per check and exits 0 when every check passes. --valgrind runs the normal-session checks under valgrind
and fails on any error or leak it reports.
"""
import fcntl
import os
import plistlib
import select
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import uuid

EXE = None
WRAPPER = []
SLOW = 1.0  # timeouts are multiplied by this (valgrind: 10)


def new_id():
    return str(uuid.uuid4()).upper()


def item(title=None, text=None, attachments=None, user_info=None, files=None):
    d = {"attachments": attachments or [], "userInfo": user_info or {}}
    if title is not None:
        d["title"] = title
    if text is not None:
        d["text"] = text
    if files is not None:
        d["files"] = files
    return d


# MARK: A bplist codec of our own, on tagged values: ("str", s), ("int", i), ("real", 8 bytes), ("date", 8 bytes),
# ("bool", b), ("data", bytes), ("array", [...]), ("dict", {key: value}); for sending only also ("real32", 4 bytes),
# ("int128", i) and ("utf16", raw big-endian bytes).

def raw_decode(b):
    if b[:8] != b"bplist00":
        raise ValueError("no magic")
    off_size, ref_size = b[-26], b[-25]
    count = int.from_bytes(b[-24:-16], "big")
    top = int.from_bytes(b[-16:-8], "big")
    table = int.from_bytes(b[-8:], "big")
    offsets = [int.from_bytes(b[table + i * off_size:table + (i + 1) * off_size], "big") for i in range(count)]

    def length(o, lo):
        if lo != 15:
            return lo, o + 1
        s = 1 << (b[o + 1] & 15)
        return int.from_bytes(b[o + 2:o + 2 + s], "big"), o + 2 + s

    def obj(i):
        o = offsets[i]
        m = b[o]
        hi, lo = m >> 4, m & 15
        if m in (8, 9):
            return ("bool", m == 9)
        if hi == 1:
            s = 1 << lo
            return ("int", int.from_bytes(b[o + 1:o + 1 + s], "big", signed=s >= 8))
        if hi == 2:
            s = 1 << lo
            bits = b[o + 1:o + 1 + s]
            return ("real", bits if s == 8 else struct.pack(">d", struct.unpack(">f", bits)[0]))
        if m == 0x33:
            return ("date", b[o + 1:o + 9])
        if hi in (4, 5, 6, 0xA, 0xD):
            n, st = length(o, lo)
            if hi == 4:
                return ("data", bytes(b[st:st + n]))
            if hi == 5:
                return ("str", b[st:st + n].decode("ascii"))
            if hi == 6:
                return ("str", b[st:st + 2 * n].decode("utf-16-be", "surrogatepass"))
            refs = [int.from_bytes(b[st + k * ref_size:st + (k + 1) * ref_size], "big") for k in range(n if hi == 0xA else 2 * n)]
            if hi == 0xA:
                return ("array", [obj(r) for r in refs])
            keys = [obj(r) for r in refs[:n]]
            return ("dict", {k[1]: obj(v) for k, v in zip(keys, refs[n:])})
        raise ValueError("marker %02x" % m)

    return obj(top)


def _int_bytes(v):
    if v < 0:
        return b"\x13" + v.to_bytes(8, "big", signed=True)
    for size, nib in ((1, 0), (2, 1), (4, 2), (8, 3)):
        if v < (1 << (8 * size)) and (size < 8 or v < (1 << 63)):
            return bytes([0x10 | nib]) + v.to_bytes(size, "big")
    raise ValueError(v)


def raw_encode(top, ref_size=None):
    objects = []

    def add(v):
        idx = len(objects)
        objects.append(None)
        if v[0] == "array":
            objects[idx] = ("array", [add(x) for x in v[1]])
        elif v[0] == "dict":
            keys = [add(("str", k)) for k in v[1]]
            values = [add(x) for x in v[1].values()]
            objects[idx] = ("dict", keys + values, len(keys))
        else:
            objects[idx] = v
        return idx

    add(top)
    n = len(objects)
    if ref_size is None:
        ref_size = 1 if n < 256 else 2 if n < 65536 else 4

    def header(marker, count):
        return bytes([marker | count]) if count < 15 else bytes([marker | 15]) + _int_bytes(count)

    body = bytearray(b"bplist00")
    offsets = []
    for o in objects:
        offsets.append(len(body))
        k = o[0]
        if k == "bool":
            body += b"\x09" if o[1] else b"\x08"
        elif k == "int":
            body += _int_bytes(o[1])
        elif k == "int128":
            body += b"\x14" + o[1].to_bytes(16, "big", signed=o[1] < 0)
        elif k == "real":
            body += b"\x23" + o[1]
        elif k == "real32":
            body += b"\x22" + o[1]
        elif k == "date":
            body += b"\x33" + o[1]
        elif k == "data":
            body += header(0x40, len(o[1])) + o[1]
        elif k == "str":
            try:
                raw = o[1].encode("ascii")
                body += header(0x50, len(raw)) + raw
            except UnicodeEncodeError:
                raw = o[1].encode("utf-16-be", "surrogatepass")
                body += header(0x60, len(raw) // 2) + raw
        elif k == "utf16":
            body += header(0x60, len(o[1]) // 2) + o[1]
        elif k == "array":
            body += header(0xA0, len(o[1])) + b"".join(r.to_bytes(ref_size, "big") for r in o[1])
        elif k == "dict":
            body += header(0xD0, o[2]) + b"".join(r.to_bytes(ref_size, "big") for r in o[1])
        else:
            raise ValueError(k)
    off_size = 1 if len(body) < 256 else 2 if len(body) < 65536 else 4
    table = len(body)
    body += b"".join(x.to_bytes(off_size, "big") for x in offsets)
    body += bytes(6) + bytes([off_size, ref_size]) + n.to_bytes(8, "big") + (0).to_bytes(8, "big") + table.to_bytes(8, "big")
    return bytes(body)


def tagged(v):
    """A plistlib-style value as a tagged one (str/int/bool/bytes/list/dict only)."""
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int):
        return ("int", v)
    if isinstance(v, str):
        return ("str", v)
    if isinstance(v, bytes):
        return ("data", v)
    if isinstance(v, list):
        return ("array", [tagged(x) for x in v])
    if isinstance(v, dict):
        return ("dict", {k: tagged(x) for k, x in v.items()})
    if isinstance(v, tuple):
        return v
    raise TypeError(type(v))


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


# MARK: A worker on a socketpair

class Exited(Exception):
    pass


def plain(v):
    """A tagged value as plistlib would give it, except reals and dates, which stay tagged (bit-exact)."""
    kind, x = v
    if kind == "array":
        return [plain(e) for e in x]
    if kind == "dict":
        return {k: plain(e) for k, e in x.items()}
    return v if kind in ("real", "date") else x


def loads(raw):
    """plistlib's reading, or ours where plistlib gives up (a date it cannot represent, say)."""
    try:
        return plistlib.loads(raw)
    except Exception:  # noqa: BLE001 - plistlib raises several kinds
        return plain(raw_decode(raw))


class Message:
    def __init__(self, raw, fds):
        self.raw = raw
        self.fds = fds
        self.obj = loads(raw)
        self.type = self.obj.get("type")

    def __getitem__(self, key):
        return self.obj[key]

    def get(self, key, default=None):
        return self.obj.get(key, default)

    def close_fds(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class Worker:
    def __init__(self, env=None, handshake=True, fd=3, idle_ms=0, no_fd=False):
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        environment = {"SDKHOST_EXTENSION_ID": "com.example.crasher-c", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if fd != 3:
            environment["SDKHOST_IPC_FD"] = str(fd)
        environment.update(env or {})
        actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                   (os.POSIX_SPAWN_DUP2, err_w, 2)]
        if no_fd:
            actions.append((os.POSIX_SPAWN_CLOSE, fd))
        else:
            actions.append((os.POSIX_SPAWN_DUP2, child.fileno(), fd))
        argv = WRAPPER + [EXE]
        # The worker starts with SIGPIPE at its default, as under the host (Python ignores it, and that would be
        # inherited).
        self.pid = os.posix_spawnp(argv[0], argv, environment, file_actions=actions, setsigdef=(signal.SIGPIPE,))
        child.close()
        os.close(out_w)
        os.close(err_w)
        self.stdout, self.stderr = bytearray(), bytearray()
        self._readers = [threading.Thread(target=self._drain, args=(out_r, self.stdout), daemon=True),
                         threading.Thread(target=self._drain, args=(err_r, self.stderr), daemon=True)]
        for t in self._readers:
            t.start()
        self.buffer = bytearray()
        self.queue = []
        self.status = None
        if handshake:
            self.hello(idle_ms=idle_ms)

    @staticmethod
    def _drain(fd, into):
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            into += chunk
        os.close(fd)

    def send(self, message, fds=()):
        self.send_raw(frame(plistlib.dumps(message, fmt=plistlib.FMT_BINARY)), fds)

    def send_raw(self, data, fds=()):
        try:
            if fds:
                socket.send_fds(self.sock, [data[:1]], list(fds))
                data = data[1:]
            if data:
                self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def hello(self, version=2, idle_ms=0):
        self.send({"type": "hello", "version": version, "identifier": "com.example.crasher-c", "hostPid": os.getpid(),
                   "idleTimeoutMs": idle_ms})
        if version == 2:
            m = self.recv()
            assert m.type == "welcome", m.obj
            assert m["version"] == 2 and m["identifier"] == "com.example.crasher-c" and isinstance(m["pid"], int), m.obj

    def begin(self, items, fds=(), rid=None):
        rid = rid or new_id()
        message = {"type": "begin", "id": rid, "items": items}
        if fds:
            message["fds"] = len(fds)
        self.send(message, fds)
        return rid

    def recv(self, timeout=5.0, skip_pongs=True):
        """The next message; None on timeout. Raises Exited at end of file."""
        deadline = time.monotonic() + timeout * SLOW
        while True:
            while len(self.buffer) >= 4:
                n = struct.unpack(">I", self.buffer[:4])[0]
                if len(self.buffer) < 4 + n:
                    break
                raw = bytes(self.buffer[4:4 + n])
                del self.buffer[:4 + n]
                count = loads(raw).get("fds", 0)
                fds, self.queue = self.queue[:count], self.queue[count:]
                m = Message(raw, fds)
                if skip_pongs and m.type == "pong":
                    continue
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                return None
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 1 << 20, 64)
            except ConnectionResetError:
                raise Exited()
            self.queue += fds
            if not data:
                raise Exited()
            self.buffer += data

    def expect(self, type_, timeout=5.0):
        m = self.recv(timeout)
        assert m is not None, "no '%s' within %.1f s" % (type_, timeout)
        assert m.type == type_, "expected '%s', got %r" % (type_, m.obj)
        return m

    def quiet(self, seconds):
        """Asserts that nothing but pongs arrives for `seconds`."""
        m = self.recv(seconds)
        assert m is None, "unexpected %r" % (m.obj,)

    def ping(self, seq=7, timeout=5.0):
        self.send({"type": "ping", "seq": seq})
        deadline = time.monotonic() + timeout * SLOW
        while time.monotonic() < deadline:
            m = self.recv(max(0.01, deadline - time.monotonic()) / SLOW, skip_pongs=False)
            if m is not None and m.type == "pong":
                assert m["seq"] == seq, m.obj
                return
            assert m is None, "expected a pong, got %r" % (m.obj,)
        raise AssertionError("no pong")

    def wait(self, timeout=5.0):
        """('exit', code) or ('signal', number), or None if still running after `timeout`."""
        if self.status is not None:
            return self.status
        deadline = time.monotonic() + timeout * SLOW
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = ("exit", os.WEXITSTATUS(status)) if os.WIFEXITED(status) else ("signal", os.WTERMSIG(status))
                for t in self._readers:
                    t.join(2)
                return self.status
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
        if self.wait(5) is None:
            os.kill(self.pid, signal.SIGKILL)
            self.wait(5)
        for fd in self.queue:
            os.close(fd)
        self.queue = []
        # A worker built with a sanitizer (-fsanitize=address,undefined or thread) reports here.
        for marker in (b"ERROR: AddressSanitizer", b"ERROR: LeakSanitizer", b"runtime error:", b"WARNING: ThreadSanitizer"):
            assert marker not in self.stderr, bytes(self.stderr[self.stderr.find(marker):][:3000]).decode(errors="replace")


# MARK: Files

def sealed_memfd(data, name="test"):
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
    return fd


def read_file(fd):
    out = bytearray()
    while True:
        chunk = os.pread(fd, 1 << 20, len(out))
        if not chunk:
            return bytes(out)
        out += chunk


def regular_file(data, mode=os.O_RDONLY):
    f = tempfile.NamedTemporaryFile(delete=False)
    f.write(data)
    f.close()
    fd = os.open(f.name, mode | os.O_CLOEXEC)
    os.unlink(f.name)
    return fd


# MARK: Checks

CHECKS = []


def check(name, normal=True):
    """`normal`: part of a normal session (run under valgrind too): no crash, no kill."""
    def register(body):
        CHECKS.append((name, body, normal))
        return body
    return register


CONFORMANCE = {"SDKHOST_CONFORMANCE": "1"}


def conformance_begin(w, command, extra=(), fds=()):
    return w.begin([item(title="sdkhost.conformance", text=command)] + list(extra), fds=fds)


@check("handshake: welcome {version 2, identifier, pid}")
def _():
    w = Worker()
    w.close()
    assert w.status == ("exit", 0), w.status


@check("no host connection: a clear line on stderr, exit 64", normal=False)
def _():
    w = Worker(handshake=False, no_fd=True)
    assert w.wait(5) == ("exit", 64), w.status
    assert b"sdk-host" in w.stderr, bytes(w.stderr)


@check("SDKHOST_IPC_FD: the connection on another descriptor")
def _():
    w = Worker(fd=7)
    w.ping()
    w.close()


@check("hello of protocol 1: exit 2", normal=False)
def _():
    w = Worker(handshake=False)
    w.hello(version=1)
    assert w.wait(5) == ("exit", 2), w.status


@check("ping: pong with the same seq")
def _():
    w = Worker()
    w.ping(41)
    w.close()


@check("ping answered while a handler blocks (hang)")
def _():
    w = Worker()
    w.begin([item(title="hang")])
    for seq in range(3):
        w.ping(seq)
    w.close()
    assert w.status == ("exit", 0), w.status


@check("EOF from the host: exit 0")
def _():
    w = Worker()
    w.sock.close()
    assert w.wait(5) == ("exit", 0), w.status


@check("idle backstop: exit 0 after 2 x idleTimeoutMs with no request")
def _():
    w = Worker(idle_ms=150)
    start = time.monotonic()
    status = w.wait(5)
    took = time.monotonic() - start
    assert status == ("exit", 0), status
    assert took >= 0.25, "exited after %.2f s" % took


@check("idle backstop: not while a request is in progress")
def _():
    w = Worker(idle_ms=100)
    w.begin([item(title="slow:%d" % int(1000 * SLOW))])
    assert w.wait(0.6) is None, w.status
    w.expect("complete", 5)
    w.close()


ALL_KINDS = [
    ("str", ""), ("str", "plain ascii"), ("str", "a string longer than fifteen characters"),
    ("str", "naïve — ünïcödé ✓"), ("str", "emoji 😀 and 𝄞"), ("str", "nul\x00inside"),
    ("int", 0), ("int", 1), ("int", 255), ("int", 256), ("int", 65535), ("int", 65536), ("int", 2**32 - 1),
    ("int", 2**32), ("int", 2**63 - 1), ("int", -1), ("int", -2**63),
    ("real", struct.pack(">d", 0.1)), ("real", struct.pack(">d", -0.0)), ("real", struct.pack(">d", float("inf"))),
    ("real", bytes.fromhex("7ff8000000000123")), ("real", struct.pack(">d", 1e-310)),
    ("date", struct.pack(">d", 786297600.123456789)), ("date", struct.pack(">d", -1e9)),
    ("date", bytes.fromhex("7ff8000000000001")),
    ("bool", True), ("bool", False),
    ("data", b""), ("data", bytes(range(256)) * 3),
    ("array", []), ("array", [("int", i) for i in range(20)]),
    ("dict", {}), ("dict", {"k%02d" % i: ("int", i) for i in range(20)}),
    ("dict", {"nested": ("array", [("dict", {"deep": ("array", [("date", struct.pack(">d", 1.5))])})]),
              "ключ": ("str", "значение")}),
]


def echo_items():
    return ("array", [
        ("dict", {"title": ("str", "echo"), "text": ("str", "text ✓"), "attachments": ("array", ALL_KINDS),
                  "userInfo": ("dict", {"kind %d" % i: v for i, v in enumerate(ALL_KINDS)})}),
        ("dict", {"attachments": ("array", []), "userInfo": ("dict", {})}),
        ("dict", {"title": ("str", ""), "attachments": ("array", [("data", b"\x07" * 100000)]), "userInfo": ("dict", {})}),
    ])


def begin_raw(w, items, rid=None, fds=()):
    rid = rid or new_id()
    d = {"type": ("str", "begin"), "id": ("str", rid), "items": items}
    if fds:
        d["fds"] = ("int", len(fds))
    w.send_raw(frame(raw_encode(("dict", d))), fds)
    return rid


@check("echo (the extension's handler): every value kind back bit for bit")
def _():
    w = Worker()
    items = echo_items()
    rid = begin_raw(w, items)
    m = w.expect("complete")
    back = raw_decode(m.raw)[1]
    assert back["id"] == ("str", rid)
    assert back["items"] == items, "items differ"
    w.close()


@check("decoding: a 4-byte real is read as the double it is; a 16-byte integer within Int64 is read")
def _():
    w = Worker()
    items = ("array", [("dict", {"attachments": ("array", [("real32", struct.pack(">f", 1.25)), ("int128", -5), ("int128", 7)]),
                                  "userInfo": ("dict", {})})])
    begin_raw(w, items)
    back = raw_decode(w.expect("complete").raw)[1]["items"]
    assert back[1][0][1]["attachments"] == ("array", [("real", struct.pack(">d", 1.25)), ("int", -5), ("int", 7)]), back
    w.close()


@check("decoding: UTF-16 with a lone surrogate becomes U+FFFD")
def _():
    w = Worker()
    items = ("array", [("dict", {"title": ("utf16", "ab".encode("utf-16-be") + b"\xd8\x00" + "c".encode("utf-16-be")),
                                  "attachments": ("array", []), "userInfo": ("dict", {})})])
    begin_raw(w, items)
    m = w.expect("complete")
    assert m["items"][0]["title"] == "ab\ufffdc", m["items"]
    w.close()


@check("cancel: the handler sees it (slow:<ms> honours cancel) -> cancelled SDKHost 1")
def _():
    w = Worker()
    rid = w.begin([item(title="slow:10000")])
    time.sleep(0.1)
    w.send({"type": "cancel", "id": rid})
    m = w.expect("cancelled", 3)
    assert m["id"] == rid and m["error"] == {"domain": "SDKHost", "code": 1, "message": "cancelled by the host"}, m.obj
    w.close()


@check("cancel of a request nobody holds any more (hang ignores it, stall's handler returned): no answer from hang")
def _():
    w = Worker()
    rid = w.begin([item(title="hang")])
    time.sleep(0.1)
    w.send({"type": "cancel", "id": rid})
    w.quiet(0.5)
    w.send({"type": "cancel", "id": new_id()})  # unknown id: ignored
    w.ping()
    w.close()


@check("cancel by the extension: cancelled com.example.crasher-c 42")
def _():
    w = Worker()
    rid = w.begin([item(title="cancel")])
    m = w.expect("cancelled")
    assert m["id"] == rid and m["error"] == {"domain": "com.example.crasher-c", "code": 42,
                                             "message": "cancelled by the extension on request"}, m.obj
    w.close()


@check("complete is idempotent: double -> the runtime sends one completion only")
def _():
    w = Worker()
    rid = w.begin([item(title="double")])
    titles = [w.expect("complete")["items"][0]["title"] for _ in range(3)]
    assert titles == ["first", "duplicate", "first"], titles
    w.quiet(0.3)
    w.close()
    assert b"already finished" in w.stderr, bytes(w.stderr)


@check("a reply too large for a frame: cancelled SDKExtension 3")
def _():
    w = Worker()
    w.begin([item(title="bigreply:17")])
    m = w.expect("cancelled", 20)
    assert m["error"]["domain"] == "SDKExtension" and m["error"]["code"] == 3, m.obj
    assert m["error"]["message"].startswith("reply too large"), m.obj
    w.close()


@check("a reply just under the frame limit: completed")
def _():
    w = Worker()
    w.begin([item(title="bigreply:15")])
    m = w.expect("complete", 20)
    assert len(m["items"][0]["attachments"][0]) == 15 << 20
    w.close()


@check("env:NAME reads the environment the host passed")
def _():
    w = Worker()
    w.begin([item(title="env:SDKHOST_EXTENSION_ID")])
    assert w.expect("complete")["items"][0]["title"] == "com.example.crasher-c"
    w.close()


@check("print:TEXT reaches stdout as a line, at once")
def _():
    w = Worker()
    w.begin([item(title="print:hello from C")])
    w.expect("complete")
    deadline = time.monotonic() + 5 * SLOW
    while b"hello from C\n" not in w.stdout and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b"hello from C\n" in w.stdout, bytes(w.stdout)  # while the worker lives: line-buffered, not at exit
    w.close()


@check("the fault is picked by the first string attachment when there is no title")
def _():
    w = Worker()
    w.begin([item(attachments=["cancel"])])
    assert w.expect("cancelled")["error"]["code"] == 42
    w.close()


@check("partial results wait for credit (stream-abort:20: 16, then 4 more after credit, then SIGABRT)", normal=False)
def _():
    w = Worker()
    rid = w.begin([item(title="stream-abort:20")])
    got = [w.expect("partial")["items"][0]["title"] for _ in range(16)]
    assert got == ["partial %d" % i for i in range(16)], got
    w.quiet(0.4)
    w.send({"type": "credit", "id": rid, "count": 4})
    got = [w.expect("partial")["items"][0]["title"] for _ in range(4)]
    assert got == ["partial %d" % i for i in range(16, 20)], got
    assert w.wait(5) == ("signal", signal.SIGABRT), w.status
    w.close()


@check("descriptors both ways (the handler's echo): files in the same places, same bytes")
def _():
    w = Worker()
    a, b, c = sealed_memfd(b"alpha"), regular_file(b"beta" * 1000), sealed_memfd(b"")
    rid = w.begin([item(title="echo", files=[0]), item(files=[1, 2]), item(files=[0])], fds=[a, b, c])
    for fd in (a, b, c):
        os.close(fd)
    m = w.expect("complete")
    assert m["fds"] == 4 and len(m.fds) == 4, m.obj
    assert [it.get("files") for it in m["items"]] == [[0], [1, 2], [3]], m["items"]
    assert [read_file(fd) for fd in m.fds] == [b"alpha", b"beta" * 1000, b"", b"alpha"]
    m.close_fds()
    w.ping()
    w.close()


@check("host call (blocking form): hostCall with the items, result -> complete")
def _():
    w = Worker()
    rid = w.begin([item(title="call:document.part", text="x")])
    call = w.expect("hostCall")
    assert call["id"] == rid and call["service"] == "document.part" and call["call"] > 0, call.obj
    assert call["items"][0]["text"] == "x"
    fd = sealed_memfd(b"from the app")
    w.send({"type": "hostCallResult", "id": rid, "call": call["call"], "items": [item(title="answer", files=[0])], "fds": 1}, [fd])
    os.close(fd)
    m = w.expect("complete")
    assert m["items"][0]["title"] == "answer" and read_file(m.fds[0]) == b"from the app", m.obj
    m.close_fds()
    w.close()


@check("host call: an answer for a call no longer waited for is dropped")
def _():
    w = Worker()
    w.send({"type": "hostCallResult", "id": new_id(), "call": 999, "items": []})
    w.send({"type": "hostCallError", "id": new_id(), "call": 998, "error": {"domain": "d", "code": 1, "message": "m"}})
    w.ping()
    w.close()


@check("host call: hostCallError -> the call's error")
def _():
    w = Worker()
    rid = w.begin([item(title="call:nope")])
    call = w.expect("hostCall")
    error = {"domain": "SDKHost", "code": 10, "message": "service 'nope' is not in this extension's HostServices"}
    w.send({"type": "hostCallError", "id": rid, "call": call["call"], "error": error})
    assert w.expect("cancelled")["error"] == error
    w.close()


@check("host call: a host cancel ends the wait, hostCallCancel goes out, call numbers are unique")
def _():
    w = Worker()
    numbers = []
    for _ in range(2):
        rid = w.begin([item(title="call:slow")])
        call = w.expect("hostCall")
        numbers.append(call["call"])
        w.send({"type": "cancel", "id": rid})
        m = w.expect("hostCallCancel")
        assert m["id"] == rid and m["call"] == call["call"], m.obj
        assert w.expect("cancelled")["error"]["code"] == 1
    assert numbers[0] != numbers[1], numbers
    w.close()


@check("leak report: a request held after it ended (hoard)")
def _():
    w = Worker(env={"SDKHOST_LEAK_CHECK_MS": "100"})
    rid = w.begin([item(title="hoard")])
    w.expect("complete")
    m = w.expect("leak", 3)
    assert m["id"] == rid and m["alive"] == ["context"] and m["afterMs"] >= 100, m.obj
    w.begin([item(title="echo")])
    w.expect("complete")
    w.quiet(0.5)  # echo releases its request: no report
    w.close()


@check("unknown message type: logged and ignored")
def _():
    w = Worker()
    w.send({"type": "somethingFromTheFuture", "x": 1})
    w.send({"type": "welcome", "version": 2, "identifier": "x", "pid": 1})
    w.send({"type": "error", "message": "the host says hi"})
    w.ping()
    w.close()
    assert w.status == ("exit", 0), w.status
    assert b"somethingFromTheFuture" in w.stderr and b"the host says hi" in w.stderr, bytes(w.stderr)


@check("many requests at once, from many threads: every one answered once")
def _():
    w = Worker()
    ids = {w.begin([item(title="slow:%d" % (i % 5 * 10), text=str(i))]) for i in range(60)}
    seen = set()
    while len(seen) < len(ids):
        m = w.expect("complete", 10)
        assert m["id"] in ids and m["id"] not in seen, m.obj
        seen.add(m["id"])
    w.close()


# MARK: Conformance mode

@check("conformance off: the title is the extension's (echo)")
def _():
    w = Worker()
    conformance_begin(w, "wait")
    m = w.expect("complete")
    assert m["items"][0]["title"] == "sdkhost.conformance"
    w.close()


@check("conformance echo: items unchanged, every descriptor back in its place")
def _():
    w = Worker(env=CONFORMANCE)
    fds = [sealed_memfd(b"one"), regular_file(b"two"), sealed_memfd(b"three")]
    items = ("array", [("dict", {"title": ("str", "sdkhost.conformance"), "text": ("str", "echo"),
                                  "attachments": ("array", ALL_KINDS), "userInfo": ("dict", {}), "files": ("array", [("int", 0)])}),
                       ("dict", {"attachments": ("array", []), "userInfo": ("dict", {"x": ("date", struct.pack(">d", 3.25))}),
                                 "files": ("array", [("int", 1), ("int", 2)])})])
    begin_raw(w, items, fds=fds)
    for fd in fds:
        os.close(fd)
    m = w.expect("complete")
    assert raw_decode(m.raw)[1]["items"] == items
    assert [read_file(fd) for fd in m.fds] == [b"one", b"two", b"three"]
    m.close_fds()
    w.close()


@check("conformance wait: nothing until cancel, then cancelled SDKHost 1")
def _():
    w = Worker(env=CONFORMANCE)
    rid = conformance_begin(w, "wait")
    w.quiet(0.4)
    w.ping()
    w.send({"type": "cancel", "id": rid})
    m = w.expect("cancelled")
    assert m["id"] == rid and m["error"] == {"domain": "SDKHost", "code": 1, "message": "cancelled by the host"}, m.obj
    w.close()


@check("conformance stream:40: 1...40 within credit (never 17 uncredited), then complete 40")
def _():
    w = Worker(env=CONFORMANCE)
    rid = conformance_begin(w, "stream:40")
    texts = []
    while len(texts) < 40:
        batch = []
        for _ in range(min(16, 40 - len(texts))):
            m = w.expect("partial")
            assert m["id"] == rid
            batch.append(m["items"][0]["text"])
        if len(texts) + len(batch) < 40:
            w.quiet(0.2)  # the window is full
        texts += batch
        w.send({"type": "credit", "id": rid, "count": len(batch)})
    assert texts == [str(k) for k in range(1, 41)], texts
    m = w.expect("complete")
    assert [it["text"] for it in m["items"]] == ["40"], m.obj
    w.close()


@check("conformance stream: cancelled mid-stream -> cancelled SDKHost 1, nothing after")
def _():
    w = Worker(env=CONFORMANCE)
    rid = conformance_begin(w, "stream:100")
    for _ in range(16):
        w.expect("partial")
    w.send({"type": "cancel", "id": rid})
    assert w.expect("cancelled")["error"]["code"] == 1
    w.send({"type": "credit", "id": rid, "count": 16})
    w.quiet(0.3)
    w.close()


@check("conformance stream:0 and credit beyond the window")
def _():
    w = Worker(env=CONFORMANCE)
    rid = conformance_begin(w, "stream:0")
    assert [it["text"] for it in w.expect("complete")["items"]] == ["0"]
    rid = conformance_begin(w, "stream:40")
    for _ in range(16):
        w.expect("partial")
    w.quiet(0.2)
    w.send({"type": "credit", "id": rid, "count": 1000})  # more than was used: the window stays 16
    for _ in range(16):
        w.expect("partial")
    w.quiet(0.2)
    w.send({"type": "credit", "id": rid, "count": -5})  # ignored
    w.quiet(0.2)
    w.send({"type": "credit", "id": rid, "count": 16})
    for _ in range(8):
        w.expect("partial")
    assert [it["text"] for it in w.expect("complete")["items"]] == ["40"]
    w.close()


@check("conformance files: new sealed memfds, the bytes reversed, in the order the items name them")
def _():
    w = Worker(env=CONFORMANCE)
    contents = [b"hello", b"", bytes(range(256)) * 4000, b"xy"]
    fds = [sealed_memfd(contents[0]), regular_file(contents[1]), regular_file(contents[2]), sealed_memfd(contents[3])]
    rid = w.begin([item(title="sdkhost.conformance", text="files", files=[3, 0]), item(files=[2, 1])], fds=fds)
    for fd in fds:
        os.close(fd)
    m = w.expect("complete", 10)
    assert m["id"] == rid and m["items"] == [item(title="files", files=[0, 1, 2, 3])], m.obj
    expected = [contents[i][::-1] for i in (3, 0, 2, 1)]
    assert [read_file(fd) for fd in m.fds] == expected
    needed = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
    for fd in m.fds:
        assert os.readlink("/proc/self/fd/%d" % fd).startswith("/memfd:")
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & needed == needed
    m.close_fds()
    w.close()


@check("conformance call:NAME: hostCall [{text: ping}], result -> complete with its items")
def _():
    w = Worker(env=CONFORMANCE)
    rid = conformance_begin(w, "call:document.part")
    call = w.expect("hostCall")
    assert call["service"] == "document.part" and call["items"] == [item(text="ping")], call.obj
    w.send({"type": "hostCallResult", "id": rid, "call": call["call"], "items": [item(title="pong", user_info={"n": 1})]})
    assert w.expect("complete")["items"] == [item(title="pong", user_info={"n": 1})]
    w.close()


@check("conformance call:NAME: hostCallError -> cancelled with that error")
def _():
    w = Worker(env=CONFORMANCE)
    rid = conformance_begin(w, "call:missing")
    call = w.expect("hostCall")
    error = {"domain": "SDKHost", "code": 11, "message": "the app provides no service 'missing'"}
    w.send({"type": "hostCallError", "id": rid, "call": call["call"], "error": error})
    assert w.expect("cancelled")["error"] == error
    w.close()


@check("conformance call:NAME: a host cancel -> hostCallCancel, then cancelled SDKHost 1")
def _():
    w = Worker(env=CONFORMANCE)
    rid = conformance_begin(w, "call:slow")
    call = w.expect("hostCall")
    w.send({"type": "cancel", "id": rid})
    assert w.expect("hostCallCancel")["call"] == call["call"]
    assert w.expect("cancelled")["error"] == {"domain": "SDKHost", "code": 1, "message": "cancelled by the host"}
    w.send({"type": "hostCallResult", "id": rid, "call": call["call"], "items": []})  # too late: dropped
    w.ping()
    w.close()


@check("conformance unknown command: cancelled sdkhost.conformance 2")
def _():
    w = Worker(env=CONFORMANCE)
    conformance_begin(w, "bogus")
    assert w.expect("cancelled")["error"] == {"domain": "sdkhost.conformance", "code": 2, "message": "unknown command bogus"}
    conformance_begin(w, "stream:x")
    assert w.expect("cancelled")["error"]["message"] == "unknown command stream:x"
    w.close()


# MARK: Protocol errors from the host: exit 2, never a crash

def expect_exit_2(payload=None, fds=(), raw=None):
    w = Worker()
    if raw is not None:
        w.send_raw(raw, fds)
    else:
        w.send_raw(frame(payload), fds)
    status = w.wait(5)
    w.close()
    for fd in fds:
        os.close(fd)
    assert status == ("exit", 2), "status %r, stderr %r" % (status, bytes(w.stderr[-300:]))
    assert b"protocol error from host" in w.stderr or b"protocol" in w.stderr, bytes(w.stderr)


def dumps(v):
    return plistlib.dumps(v, fmt=plistlib.FMT_BINARY)


@check("protocol error: a payload that is not a bplist", normal=False)
def _():
    expect_exit_2(b"not a bplist at all, definitely not")


@check("protocol error: a frame header over 16 MiB, refused before its payload", normal=False)
def _():
    expect_exit_2(raw=struct.pack(">I", (16 << 20) + 1))


@check("protocol error: a bad trailer / offsets", normal=False)
def _():
    good = bytearray(dumps({"type": "ping", "seq": 1}))
    good[-1] ^= 0x55
    expect_exit_2(bytes(good))


@check("protocol error: a truncated bplist", normal=False)
def _():
    expect_exit_2(dumps({"type": "ping", "seq": 1})[:-5])


@check("protocol error: a cycle", normal=False)
def _():
    # One array whose element is itself.
    body = b"bplist00" + b"\xa1\x00"
    payload = body + b"\x08" + bytes(6) + bytes([1, 1]) + (1).to_bytes(8, "big") + bytes(8) + (10).to_bytes(8, "big")
    expect_exit_2(payload)


@check("protocol error: nesting deeper than 512", normal=False)
def _():
    v = ("int", 1)
    for _ in range(600):
        v = ("array", [v])
    expect_exit_2(raw_encode(("dict", {"type": ("str", "ping"), "seq": ("int", 1), "deep": v})))


@check("protocol error: an integer outside Int64", normal=False)
def _():
    expect_exit_2(raw_encode(("dict", {"type": ("str", "ping"), "seq": ("int128", 2**64 - 1)})))


@check("protocol error: not a dictionary / no type / ill-typed fields", normal=False)
def _():
    expect_exit_2(dumps([1, 2, 3]))
    expect_exit_2(dumps({"seq": 1}))
    expect_exit_2(dumps({"type": "ping", "seq": "one"}))
    expect_exit_2(dumps({"type": "pong"}))
    expect_exit_2(dumps({"type": "begin", "id": "not-a-uuid", "items": []}))
    expect_exit_2(dumps({"type": "begin", "id": new_id()}))
    expect_exit_2(dumps({"type": "begin", "id": new_id(), "items": [{"title": 5}]}))
    expect_exit_2(dumps({"type": "credit", "id": new_id()}))


@check("protocol error: descriptors that do not add up", normal=False)
def _():
    expect_exit_2(dumps({"type": "begin", "id": new_id(), "items": [], "fds": 1}))
    expect_exit_2(dumps({"type": "ping", "seq": 1}), fds=[sealed_memfd(b"x")])
    expect_exit_2(dumps({"type": "ping", "seq": 1, "fds": 1}), fds=[sealed_memfd(b"x")])
    expect_exit_2(dumps({"type": "begin", "id": new_id(), "items": [item(files=[1])], "fds": 1}), fds=[sealed_memfd(b"x")])
    expect_exit_2(dumps({"type": "begin", "id": new_id(), "items": [], "fds": 65}))


@check("protocol error: descriptors that are not read-only snapshots", normal=False)
def _():
    begin = dumps({"type": "begin", "id": new_id(), "items": [item(files=[0])], "fds": 1})
    expect_exit_2(begin, fds=[regular_file(b"w", os.O_RDWR)])
    r, wr = os.pipe()
    os.close(wr)
    expect_exit_2(begin, fds=[r])
    unsealed = os.memfd_create("unsealed", os.MFD_CLOEXEC)
    expect_exit_2(begin, fds=[unsealed])
    a, b = socket.socketpair()
    b.close()
    expect_exit_2(begin, fds=[a.detach()])


@check("robustness: mutated payloads never crash the worker (exit 0 or 2 only)", normal=False)
def _():
    import random
    rng = random.Random(1234)
    seeds = [dumps({"type": "ping", "seq": 3}), raw_encode(("dict", {"type": ("str", "begin"), "id": ("str", new_id()),
                                                                     "items": echo_items()}))]
    for n in range(40):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        w = Worker()
        w.send_raw(frame(bytes(data)))
        w.send({"type": "ping", "seq": 99})
        try:
            while w.recv(0.3) is not None:
                pass
        except Exited:
            pass
        w.close()
        assert w.status in (("exit", 0), ("exit", 2)), "mutation %d: %r" % (n, w.status)


# MARK: Faults end the worker as the Swift Crasher's do

@check("faults: segv, abort, range, exit, kill, stderr end as SIGSEGV, SIGABRT, SIGILL, exit 7, SIGKILL, SIGABRT", normal=False)
def _():
    expected = {"segv": ("signal", signal.SIGSEGV), "abort": ("signal", signal.SIGABRT), "range": ("signal", signal.SIGILL),
                "exit": ("exit", 7), "kill": ("signal", signal.SIGKILL), "stderr": ("signal", signal.SIGABRT)}
    for fault, outcome in expected.items():
        w = Worker()
        w.begin([item(title=fault)])
        status = w.wait(5)
        w.close()
        assert status == outcome, "%s: %r" % (fault, status)
        if fault == "stderr":
            assert b"crasher: about to abort on request" in w.stderr


def main():
    global EXE, WRAPPER, SLOW
    args = sys.argv[1:]
    valgrind = "--valgrind" in args
    only = None
    if "--only" in args:
        only = args[args.index("--only") + 1]
        args = [a for a in args if a not in ("--only", only)]
    args = [a for a in args if a != "--valgrind"]
    if len(args) != 1:
        print(__doc__)
        return 2
    EXE = os.path.abspath(args[0])
    log = None
    if valgrind:
        log = tempfile.mkdtemp(prefix="sdkhost-valgrind-")
        WRAPPER = ["valgrind", "--quiet", "--error-exitcode=99", "--leak-check=full", "--show-leak-kinds=definite,indirect",
                   "--errors-for-leak-kinds=definite,indirect", "--track-fds=no", "--log-file=%s/vg.%%p" % log]
        SLOW = 10.0
    sys.setrecursionlimit(20000)
    passed = failed = 0
    for name, body, normal in CHECKS:
        if valgrind and not normal:
            continue
        if only and only not in name:
            continue
        try:
            body()
            print("PASS %s" % name, flush=True)
            passed += 1
        except Exception as error:  # noqa: BLE001 - a failed check of any kind is reported, not raised
            print("FAIL %s: %s: %s" % (name, type(error).__name__, error), flush=True)
            failed += 1
    if valgrind:
        reports = [os.path.join(log, f) for f in sorted(os.listdir(log))]
        dirty = [r for r in reports if os.path.getsize(r) > 0]
        for r in dirty:
            print("valgrind %s:\n%s" % (r, open(r).read()[:4000]))
        name = "valgrind: no errors and no leaks in %d worker(s)" % len(reports)
        if dirty:
            print("FAIL %s (%d report(s))" % (name, len(dirty)))
            failed += 1
        else:
            print("PASS %s" % name)
            passed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
