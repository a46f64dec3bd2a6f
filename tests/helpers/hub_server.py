"""A Hugging Face Hub on ``127.0.0.1`` answering the requests ``huggingface_hub`` makes, with ``Range`` support.

What it serves, for one repository at one commit, the way huggingface.co does:

- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``: ``model_info``'s JSON
  (``id``, ``sha``, ``siblings``);
- ``HEAD``/``GET /{repo}/resolve/{rev}/{file}``: ``X-Repo-Commit``, ``ETag`` (the LFS sha256 for
  weights, the git blob sha1 otherwise, :func:`~tests.helpers.hub_cache.hub_etag`), and for a
  ``Range: bytes=a-b`` request a ``206`` with ``Content-Range: bytes a-b/size`` and those bytes only.

:class:`ServedHub` counts the body bytes served per file and every request, so a test can
prove a command fetched headers and never a whole weight file; with ``honour_ranges`` off it
answers every ``Range`` request with the whole file, as a misbehaving proxy would. Point ``huggingface_hub`` at it
with :func:`point_huggingface_hub_at` (it reads ``HF_ENDPOINT`` once, at import).
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.helpers.hub_cache import COMMIT, hub_etag

__all__ = ["ServedHub", "point_huggingface_hub_at", "served_hub"]

_RANGE = re.compile(r"^bytes=(\d+)-(\d+)?$")


class ServedHub:
    """The endpoint's URL and what it served."""

    def __init__(self, repo_id: str, files: Mapping[str, bytes], commit: str) -> None:
        self.repo_id = repo_id
        self.files = dict(files)
        self.commit = commit
        self.endpoint = ""
        self.bytes_served: Counter[str] = Counter()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()
        self.gone: set[str] = set()
        """Files still listed by ``model_info`` but answered 404 (deleted after the listing)."""
        self.honour_ranges = True
        """``False``: answer a ``Range`` request with the whole file and status 200 (as some proxies do)."""

    def count(self, method: str, name: str, body: int) -> None:
        with self.lock:
            self.requests[(method, name)] += 1
            self.bytes_served[name] += body


class _Handler(http.server.BaseHTTPRequestHandler):
    hub: ServedHub

    def _send(self, status: int, headers: Mapping[str, str], body: bytes, send_body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def _api(self, path: str) -> bool:
        hub = self.hub
        if path not in (f"/api/models/{hub.repo_id}", f"/api/models/{hub.repo_id}/revision/main",
                        f"/api/models/{hub.repo_id}/revision/{hub.commit}"):
            return False
        info = {"id": hub.repo_id, "modelId": hub.repo_id, "sha": hub.commit, "private": False,
                "siblings": [{"rfilename": name} for name in sorted(hub.files)]}
        body = json.dumps(info).encode()
        hub.count("GET", "/api", len(body))
        self._send(200, {"Content-Type": "application/json"}, body, True)
        return True

    def _answer(self, send_body: bool) -> None:
        hub = self.hub
        path = unquote(self.path.split("?", 1)[0])
        if send_body and self._api(path):
            return
        prefix = f"/{hub.repo_id}/resolve/"
        name = path[len(prefix):].partition("/")[2] if path.startswith(prefix) else ""
        if name not in hub.files or name in hub.gone:
            hub.count(self.command, name or path, 0)
            self._send(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": hub.commit}, b"", send_body)
            return
        data = hub.files[name]
        headers = {"X-Repo-Commit": hub.commit, "ETag": f'"{hub_etag(name, data)}"', "Accept-Ranges": "bytes"}
        wanted = _RANGE.match(self.headers.get("Range", "")) if hub.honour_ranges else None
        status, body = 200, data
        if wanted is not None:
            start = int(wanted.group(1))
            end = min(int(wanted.group(2)) if wanted.group(2) else len(data) - 1, len(data) - 1)
            status, body = 206, data[start:end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        hub.count(self.command, name, len(body) if send_body else 0)
        self._send(status, headers, body, send_body)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def log_message(self, format: str, *args: object) -> None:  # silence the access log
        pass


@contextmanager
def served_hub(repo_id: str, files: Mapping[str, bytes], commit: str = COMMIT) -> Iterator[ServedHub]:
    """Serve ``files`` as ``repo_id`` at ``commit`` on a free local port for the ``with`` block."""
    hub = ServedHub(repo_id, files, commit)
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def point_huggingface_hub_at(endpoint: str, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``HF_ENDPOINT`` = ``endpoint`` and an empty cache, online, in the variables and in the values
    ``huggingface_hub.constants`` read at import."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
