"""The core's own source resolution: a local path, else a Hub id.

A Hub id is downloaded as a snapshot (:mod:`.hub`), except for ``loader inspect``
(``options.headers_only``) of a safetensors repository, which is read in
place, headers only (:mod:`.hub_files`).

Registered as plugin ``core.sources`` with ``trylast`` so plugins that claim
URI schemes (``s3://``) answer first.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .._model_folder import cache_repository
from .._options import LoadOptions
from ..checkpoint import Source
from ..errors import SourceNotFoundError
from ..hookspecs import hookimpl

__all__ = ["looks_like_hub_id", "looks_like_path", "loader_resolve_source"]

_PATH_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".json")

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def looks_like_hub_id(location: str) -> bool:
    """``org/name`` (or a bare ``name``) with only the characters the Hub allows."""
    return bool(_HUB_ID.match(location)) and ".." not in location and not location.endswith(".gguf")


def looks_like_path(location: str) -> bool:
    """Whether ``location`` can only mean a local path: ``/``, ``.``, ``~`` first, a backslash, more than one
    ``/``, or a checkpoint file's suffix. Such a location that does not exist is a missing path; asking the
    Hub for it would only add a confusing network error.
    """
    return (location.startswith(("/", ".", "~")) or "\\" in location or location.count("/") > 1
            or location.lower().endswith(_PATH_SUFFIXES))


def _exists_and_is_readable(path: Path) -> bool:
    """Whether ``path`` exists; if it cannot be reached, listed, searched or read, a :class:`SourceNotFoundError`.

    Found here, once, rather than as a bare ``PermissionError`` from whichever plugin first lists the
    folder or stats a file in it (format detection, the sharded-state marker, the config reader).
    """
    step = "a parent folder cannot be searched"
    try:
        if not path.exists():
            return False
        if path.is_dir():
            step = "the folder cannot be listed"
            with os.scandir(path) as entries:
                next(entries, None)
            step = "the folder cannot be searched"
            os.stat(os.path.join(path, "."))  # (pathlib would drop the ".")
        else:
            step = "the file cannot be read"
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # non-blocking: a FIFO must not hang here
    except PermissionError as exc:
        raise SourceNotFoundError(f"{path}: permission denied ({step})") from exc
    except OSError as exc:
        if step.startswith("a parent"):  # exists() itself failed: a name too long for the file system, ...
            raise SourceNotFoundError(f"{path}: not a usable path ({exc.strerror or exc})") from exc
        # anything else (a socket cannot be opened) is the format or config reader's to report, as before
    return True


def _resolved_keeping_file_name(path: Path) -> Path:
    """``path`` resolved, except that a file of a Hugging Face cache snapshot keeps its name and folder.

    Such a file is a link to ``blobs/<sha256>``: resolved whole, it would lose the name that says
    its format and the snapshot folder that holds its ``config.json``. Any other link the user
    names is followed to its real file and folder, as before.
    """
    if path.is_symlink() and not path.is_dir() and cache_repository(path.parent.resolve()) is not None:
        return path.parent.resolve() / path.name
    return path.resolve()


@hookimpl(trylast=True)
def loader_resolve_source(location: str, options: LoadOptions) -> Source | None:
    path = Path(location).expanduser()
    if _exists_and_is_readable(path):
        return Source(location=location, path=_resolved_keeping_file_name(path), revision=options.revision)
    if "://" in location:
        return None
    if looks_like_path(location):
        raise SourceNotFoundError(f"{location}: no such file or directory")
    if looks_like_hub_id(location):
        from .hub import download_snapshot

        if options.headers_only:  # loader inspect: side files and headers, never the weights
            from .hub_files import hub_header_source

            remote = hub_header_source(location, options.revision, options.load_format)
            if remote is not None:
                return remote

        folder = download_snapshot(location, revision=options.revision, load_format=options.load_format)
        return Source(location=location, path=folder, revision=options.revision)
    return None
