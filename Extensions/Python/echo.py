#!/usr/bin/python3
"""Echo (com.example.echo-python): returns its input items, written against the Python runtime (sdkhost.py).

The first item's title picks the behaviour, so that a demo can show partial results and cancellation:
  "slow:<ms>"   wait that long, checking for a cancel every 10 ms, then echo; a host cancel ends it cancelled
  "stream:<n>"  send n partial results [{text: "1"}] ... [{text: "n"}], then echo
  anything else echo at once

A synchronous handler: the runtime then never imports asyncio, which is ~30 ms of every cold start
(docs/PYTHON-RUNTIME.md shows the async form).
"""
import os
import sys
import time

# `import sdkhost` finds the module beside this script; also under `python3 -I` or `-P`, which leave the script's
# folder off sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdkhost  # noqa: E402


def _number(command, prefix):
    """The non-negative integer after `prefix` in `command`, or None."""
    rest = command[len(prefix):] if command.startswith(prefix) else ""
    return int(rest) if rest.isascii() and rest.isdigit() else None


def handle(ctx):
    """Echoes the request's items, after a wait or a stream of partial results when the first title asks."""
    command = (ctx.input_items[0].title if ctx.input_items else None) or ""
    slow = _number(command, "slow:")
    count = _number(command, "stream:")
    if slow is not None:
        deadline = time.monotonic() + slow / 1000
        while time.monotonic() < deadline:
            if ctx.wait_cancelled(0.01):
                return ctx.cancel("SDKHost", 1, "cancelled by the host")
    elif count is not None:
        for k in range(1, count + 1):
            if not ctx.send([sdkhost.Item(text=str(k))]):
                return ctx.cancel("SDKHost", 1, "cancelled by the host")
    ctx.complete(ctx.input_items)


if __name__ == "__main__":
    sdkhost.run(handle)
