"""A local HTTP server that answers single-range GETs (Python's own ``http.server`` ignores ``Range``,
and tensorizer's parallel readers and seeks need it), on 127.0.0.1 in a thread."""

from __future__ import annotations

import functools
import http.server
import os
import re
import threading
from pathlib import Path
from typing import Any

__all__ = ["RangeHTTPServer"]

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class _Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # tensorizer reads only HTTP/1.1 and HTTP/2 status lines

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_head(self) -> Any:
        match = _RANGE.match(self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        cut = getattr(self.server, "cut_after", None)
        if (match is None and cut is None) or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        begin = int(match.group(1)) if match else 0
        end = min(int(match.group(2)) if match and match.group(2) else size - 1, size - 1)
        if begin >= size:
            self.send_error(416)
            return None
        handle = open(path, "rb")  # noqa: SIM115 - the base class closes it after copying
        handle.seek(begin)
        self.send_response(206 if match else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        if match:
            self.send_header("Content-Range", f"bytes {begin}-{end}/{size}")
        self.send_header("Content-Length", str(end - begin + 1))
        self.end_headers()
        if cut is not None:
            self.close_connection = True
        return _Limited(handle, end - begin + 1 if cut is None else min(end - begin + 1, cut))

    def end_headers(self) -> None:
        if not self.headers.get("Range"):
            self.send_header("Accept-Ranges", "bytes")
        super().end_headers()


class _Limited:
    """A file that reads at most ``left`` bytes (the range's end), as ``copyfile`` reads to EOF."""

    def __init__(self, handle: Any, left: int) -> None:
        self.handle = handle
        self.left = left

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        data = self.handle.read(size)
        self.left -= len(data)
        return bytes(data)

    def close(self) -> None:
        self.handle.close()


class RangeHTTPServer:
    """Serves ``folder`` at :attr:`url` until :meth:`stop`; ``cut_after`` bytes, every answer breaks off
    (its headers promise the whole file or range, then the connection closes)."""

    def __init__(self, folder: Path, cut_after: int | None = None) -> None:
        handler = functools.partial(_Handler, directory=str(folder))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.cut_after = cut_after  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
