"""The core's own source resolution: a local path, else a Hub id.

Registered as plugin ``core.sources`` with ``trylast`` so plugins that claim
URI schemes (``s3://``) answer first.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..checkpoint import Source
from ..hookspecs import hookimpl
from ..options import LoadOptions

__all__ = ["looks_like_hub_id", "loader_resolve_source"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def looks_like_hub_id(location: str) -> bool:
    """``org/name`` (or a bare ``name``) with only the characters the Hub allows."""
    return bool(_HUB_ID.match(location)) and ".." not in location and not location.endswith(".gguf")


@hookimpl(trylast=True)
def loader_resolve_source(location: str, options: LoadOptions) -> Source | None:
    path = Path(location).expanduser()
    if path.exists():
        return Source(location=location, path=path.resolve(), revision=options.revision)
    if "://" in location or location.startswith(("/", ".", "~")):
        return None
    if looks_like_hub_id(location):
        from .hub import download_snapshot

        folder = download_snapshot(location, revision=options.revision, load_format=options.load_format)
        return Source(location=location, path=folder, revision=options.revision)
    return None
