"""The model folder's boundary: which files a load may open, one rule for every file.

A file a load reads (weights, the index, ``config.json``, ``params.json``, tokenizer
files) must resolve, symlinks followed, to a path inside the model folder -- or, when
the folder is a snapshot of a Hugging Face cache, inside the blobs of the *same*
repository. ``huggingface_hub`` stores each file once, as
``<cache>/models--org--name/blobs/<etag>``, and makes every
``snapshots/<revision>/<file>`` a relative symlink to it (``../../blobs/<etag>``, one
``../`` more per sub-folder), so a real cache snapshot is made of links that leave the
snapshot folder but stay in its repository's ``blobs/``. Anything else a link reaches
(another repository's blobs, ``/etc``, ``/dev/zero``, a file beside the folder) is
refused by name before it is opened: a checkpoint from a stranger must not make the
loader read files it did not ship.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from .errors import CheckpointFormatError, ConfigError, LoadError

__all__ = ["FolderBoundary", "allowed_roots", "cache_repository", "require_inside", "side_file"]

CACHE_REPO_PREFIX = "models--"


def cache_repository(folder: Path) -> Path | None:
    """``<cache>/models--org--name`` when ``folder`` (resolved) is a snapshot or a sub-folder of one."""
    for snapshot in (folder, *folder.parents):
        if snapshot.parent.name == "snapshots" and snapshot.parent.parent.name.startswith(CACHE_REPO_PREFIX):
            return snapshot.parent.parent
    return None


def allowed_roots(folder: Path) -> tuple[Path, ...]:
    """The resolved folders a file of ``folder`` may resolve into: the folder, and its cache repo's blobs."""
    root = folder.resolve()
    repository = cache_repository(root)
    if repository is None:
        return (root,)
    return (root, (repository / "blobs").resolve())


@attrs.frozen
class FolderBoundary:
    """:func:`allowed_roots` of one folder, resolved once for the many files of a checkpoint."""

    roots: tuple[Path, ...]

    @classmethod
    def of(cls, folder: Path) -> FolderBoundary:
        return cls(allowed_roots(folder))

    def require_inside(self, path: Path, *, label: str | None = None,
                       error: type[LoadError] = CheckpointFormatError) -> Path:
        """Return ``path`` resolved, or raise ``error`` naming it when it resolves outside the roots.

        :param path: the file as the folder names it (a link is followed; a dangling one is judged by its target).
        :param label: how the message names the file (default: ``path`` itself).
        :param error: the :class:`LoadError` subclass to raise (``ConfigError`` for configuration files).
        """
        try:
            real = path.resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop, a name the file system refuses
            raise error(f"{label or path}: cannot resolve the file ({exc})") from exc
        if any(real == root or root in real.parents for root in self.roots):
            return real
        where = f"the model folder {self.roots[0]}"
        if len(self.roots) > 1:
            where += f" and its Hugging Face cache blobs {self.roots[1]}"
        raise error(f"{label or path} resolves to {real}, outside {where}")


def require_inside(path: Path, folder: Path, *, label: str | None = None,
                   error: type[LoadError] = CheckpointFormatError) -> Path:
    """:meth:`FolderBoundary.require_inside` for one file of ``folder``."""
    return FolderBoundary.of(folder).require_inside(path, label=label, error=error)


def side_file(folder: Path, name: str) -> Path | None:
    """``folder / name`` if it is a file there; ``None`` if absent; refused if it links out of the folder.

    :raises ConfigError: the name is a link resolving outside the folder (the rule above).
    """
    path = folder / name
    if path.is_symlink():
        require_inside(path, folder, error=ConfigError)
    return path if path.is_file() else None
