"""A real S3-compatible server for tests and benchmarks: moto's ``ThreadedMotoServer`` on 127.0.0.1.

The server runs in this process on a free port; :class:`CountingMotoServer`
adds what the tests need to observe and break it from the outside, in the
WSGI layer in front of moto (moto itself is unchanged):

- ``bytes_served``: body bytes of every GET, by ``bucket/key`` — how a test
  proves a rank fetched only its own object;
- ``requests``: every request, by ``(method, bucket/key)`` — how a test proves
  a command sent no HEAD it did not need;
- ``on_get``: a callback run before a GET is served (replace or truncate an
  object mid-load);
- :meth:`CountingMotoServer.kill`: stop accepting and cut every open
  connection, as a server that goes away does.

:func:`s3_environment` gives the AWS variables that point boto3 and the Run:ai
streamer at it (path-style addressing, dummy keys, no EC2 metadata lookups).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

__all__ = ["CountingMotoServer", "free_port", "s3_environment", "upload_folder"]

GetHook = Callable[[str, str | None], None]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def s3_environment(endpoint: str) -> dict[str, str]:
    """The variables that point boto3 and the streamer at ``endpoint`` with dummy credentials."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
    }


class CountingMotoServer(ThreadedMotoServer):
    """``ThreadedMotoServer`` that counts the bytes it serves and can be broken on purpose."""

    def __init__(self, port: int | None = None) -> None:
        super().__init__(ip_address="127.0.0.1", port=port or free_port(), verbose=False)
        self.bytes_served: Counter[str] = Counter()
        self.gets: Counter[str] = Counter()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.on_get: GetHook | None = None
        self.dead = False
        self._lock = threading.Lock()
        logging.getLogger("werkzeug").setLevel(logging.ERROR)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def reset_counts(self) -> None:
        with self._lock:
            self.bytes_served.clear()
            self.gets.clear()
            self.requests.clear()

    def _server_entry(self) -> None:
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server(self._ip_address, self._port, self._middleware(app), True,
                                   request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()

    def _cut(self, environ: dict[str, Any]) -> None:
        sock = environ.get("werkzeug.socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _middleware(self, app: Any) -> Any:
        def served(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            if self.dead:
                self._cut(environ)
                start_response("503 Service Unavailable", [("Content-Length", "0")])
                return []
            key = environ.get("PATH_INFO", "").lstrip("/")
            method = str(environ.get("REQUEST_METHOD"))
            with self._lock:
                self.requests[(method, key)] += 1
            is_get = method == "GET"
            if is_get and self.on_get is not None:
                self.on_get(key, environ.get("HTTP_RANGE"))
            body = app(environ, start_response)
            if not is_get:
                return body  # type: ignore[no-any-return]
            with self._lock:
                self.gets[key] += 1
            return self._counted(key, body, environ)

        return served

    def _counted(self, key: str, body: Iterable[bytes], environ: dict[str, Any]) -> Iterator[bytes]:
        try:
            for chunk in body:
                if self.dead:
                    self._cut(environ)
                    return
                with self._lock:
                    self.bytes_served[key] += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()

    def kill(self) -> None:
        """Go away: refuse new connections and cut the open ones (keep-alive ones included)."""
        self.dead = True
        if self._server is not None:
            threading.Thread(target=self._close_listener, daemon=True).start()

    def _close_listener(self) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            super().stop()


def upload_folder(client: Any, folder: Path, bucket: str, prefix: str) -> list[str]:
    """Upload every file directly in ``folder`` under ``bucket/prefix/``; return the keys."""
    keys = []
    for path in sorted(folder.iterdir()):
        if path.is_file():
            key = f"{prefix.strip('/')}/{path.name}" if prefix.strip("/") else path.name
            client.upload_file(str(path), bucket, key)
            keys.append(key)
    return keys
