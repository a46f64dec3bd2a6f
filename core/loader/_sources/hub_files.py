"""A Hub repository read file by file, for ``loader inspect``: side files fetched, weights' headers only.

``loader inspect org/name`` needs the config, the index and each shard's
safetensors header, never the tensors. With ``options.headers_only``
set, a Hub id resolves to a remote :class:`~loader.checkpoint.Source` whose
reader is a :class:`HubFiles` (one ``model_info`` request lists the commit and
its files); the core reads ``config.json`` and the index through it
(``hf_hub_download``, so they land in the usual cache), and each shard's header
costs two HTTP ``Range`` requests (the 8-byte length, then the header) checked
by the one safetensors parser (:func:`loader.checkpoint.read_safetensors_header`).

Only safetensors repositories take this path; anything else (``.bin``,
GGUF, Mistral's native layout, sharded state), offline mode or a Hub that
cannot be reached falls back to the snapshot download and its documented
behaviour (:mod:`.hub`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import PurePosixPath

from ..checkpoint import SafetensorsHeader, Source, read_safetensors_header
from ..errors import LoadError, SourceNotFoundError
from ..weights import HeaderOnlyTensor, ReadStats
from .hub import LISTING_TIMEOUT_S, _offline, is_network_failure

__all__ = ["HubFiles", "hub_header_source"]

SUFFIX = ".safetensors"
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
_OTHER_LAYOUTS = ("consolidated", "model-rank-")
"""Names of safetensors layouts another format reads (Mistral's native files, sharded state)."""


class HubFiles:
    """The files of one repository at one commit (a :class:`~loader.checkpoint.SourceReader`)."""

    def __init__(self, repo_id: str, commit: str, files: Sequence[str]) -> None:
        self.repo_id = repo_id
        self.commit = commit
        self.files = tuple(sorted(files))

    def list_files(self) -> Sequence[str]:
        return self.files

    def weight_files(self) -> list[str]:
        """The ``*.safetensors`` files, ``original/**`` left out."""
        return [f for f in self.files if f.endswith(SUFFIX) and not f.startswith("original/")]

    def url(self, name: str) -> str:
        from huggingface_hub import hf_hub_url

        return str(hf_hub_url(self.repo_id, name, revision=self.commit))

    def read_bytes(self, name: str, limit: int) -> bytes | None:
        """A small file's bytes through the cache (``hf_hub_download``); ``None`` if the repository lacks it."""
        if name not in self.files:
            return None
        from huggingface_hub import hf_hub_download

        try:
            path = hf_hub_download(self.repo_id, name, revision=self.commit)
            with open(path, "rb") as fh:
                return fh.read(limit + 1)
        except Exception as exc:
            raise _failed(self.url(name), exc) from exc

    def _ranged(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        """``length`` bytes of ``name`` from ``start`` and the file's size, by one ``Range`` request.

        A server that answers with the whole file (status 200) is refused before its body is read:
        inspecting must never download the weights.
        """
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        url = self.url(name)
        headers = {**build_hf_headers(), "Range": f"bytes={start}-{start + length - 1}"}
        try:
            with get_session().stream("GET", url, headers=headers, timeout=LISTING_TIMEOUT_S) as response:
                hf_raise_for_status(response)
                match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
                if response.status_code != 206 or match is None:
                    raise SourceNotFoundError(
                        f"{url}: the server ignored the Range request (status {response.status_code}); "
                        "'loader inspect' reads headers only and will not download the file"
                    )
                data = response.read()
        except Exception as exc:
            raise _failed(url, exc) from exc
        return data[:length], int(match.group(3))

    def read_header(self, name: str, stats: ReadStats) -> SafetensorsHeader:
        """``name``'s validated header, from two ranged requests (the length, then the header)."""
        first, size = self._ranged(name, 0, 8)
        stats.add(len(first))

        def read_range(start: int, length: int) -> bytes:
            if start == 0 and length <= len(first):
                return first[:length]
            data, _ = self._ranged(name, start, length)
            stats.add(len(data))
            return data

        return read_safetensors_header(read_range, size, self.url(name))

    def iter_header_tensors(self, names: Sequence[str], stats: ReadStats) -> Iterator[tuple[str, HeaderOnlyTensor]]:
        """``(name, HeaderOnlyTensor)`` for every tensor of the files ``names``, in file order."""
        for name in names:
            header = self.read_header(name, stats)
            for info in header.tensors.values():
                yield info.name, HeaderOnlyTensor(info.name, header.path, info.dtype, info.shape)


def _failed(url: str, exc: Exception) -> Exception:
    """A request's failure as one line naming the file (a :class:`SourceNotFoundError`), unless it already is one."""
    if isinstance(exc, LoadError):
        return exc
    reason = " ".join(str(exc).split())[:200] or type(exc).__name__
    return SourceNotFoundError(f"{url}: the Hugging Face Hub request failed ({type(exc).__name__}: {reason})")


def hub_header_source(repo_id: str, revision: str | None, load_format: str) -> Source | None:
    """A remote source for a safetensors repository, or ``None`` to take the snapshot download instead.

    ``None`` when offline, when the listing fails (the download path then reports the failure, or
    falls back to the cache, as documented), for formats other than safetensors, and for repositories
    with no safetensors weights or with a layout another format reads.
    """
    if _offline() or load_format not in ("auto", "safetensors"):
        return None
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = huggingface_hub.HfApi().model_info(repo_id, revision=revision, timeout=LISTING_TIMEOUT_S)
    except Exception as exc:
        if is_network_failure(exc) or isinstance(exc, (HfHubHTTPError, OSError, ValueError)):
            return None  # the snapshot path asks again and reports it (or uses the cache)
        raise
    files = [s.rfilename for s in info.siblings or ()]
    reader = HubFiles(repo_id, str(info.sha or revision or "main"), files)
    weights = reader.weight_files()
    if not weights or any(PurePosixPath(f).name.startswith(_OTHER_LAYOUTS) for f in weights):
        return None
    uri = reader.url("x").rsplit("/", 1)[0]
    return Source(location=repo_id, path=None, uri=uri, revision=revision, reader=reader)
