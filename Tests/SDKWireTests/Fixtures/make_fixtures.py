#!/usr/bin/env python3
"""Writes the interop fixtures for SDKWireTests with Python's plistlib, an independent bplist00 implementation.

Each fixture NAME has NAME.bplist (plistlib FMT_BINARY, which deduplicates equal objects) and NAME.xml
(FMT_XML, the expected value, read in the tests through Foundation). Re-run after editing: python3 make_fixtures.py
"""
import datetime
import pathlib
import plistlib

here = pathlib.Path(__file__).parent

fixtures = {
    "integers": [0, 1, 14, 15, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
                 2**48, 2**63 - 1, -1, -128, -129, -32768, -2**31, -2**63],
    "reals": [0.0, -0.0, 1.5, -2.25, 3.141592653589793, 1e-300, 1e300, float("inf"), float("-inf")],
    "strings": {"ascii": "hello", "empty": "", "latin": "héllo wörld", "cjk": "日本語テキスト",
                "emoji": "smile 😀 and 𝄞", "long_ascii": "x" * 300, "long_utf16": "ü" * 40},
    "dates": [datetime.datetime(2001, 1, 1), datetime.datetime(1970, 1, 1),
              datetime.datetime(2026, 11, 20, 23, 24, 36), datetime.datetime(1900, 6, 1, 12, 0, 0)],
    "data": {"empty": b"", "short": b"\x00\x01\x02", "long": bytes(range(256)) * 3},
    "bools": [True, False, True],
    "empty_containers": {"array": [], "dict": {}, "nested": [[], {}, [[]]]},
    "deep": None,  # filled below
    "large_array": list(range(70_000)),
    "shared": {"a": ["same", "same", 42, 42], "b": ["same", 42], "c": {"k": "same"}},
    "message": {"type": "begin", "id": "6F9619FF-8B86-D011-B42D-00C04FC964FF",
                "items": [{"title": "hi", "attachments": ["x", b"\xff" * 5], "userInfo": {"n": 1, "f": 0.5}}]},
}

deep = "bottom"
for i in range(200):
    deep = [deep] if i % 2 else {"level": deep}
fixtures["deep"] = deep

for name, value in fixtures.items():
    (here / f"{name}.bplist").write_bytes(plistlib.dumps(value, fmt=plistlib.FMT_BINARY, sort_keys=False))
    (here / f"{name}.xml").write_bytes(plistlib.dumps(value, fmt=plistlib.FMT_XML, sort_keys=False))
print(f"wrote {len(fixtures)} fixtures to {here}")
