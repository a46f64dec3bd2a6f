"""Whether fresh CPU memory that a load writes whole is advised for transparent huge pages.

Why it depends on the machine: on bare metal one 2 MiB fault zeroes and maps
512 pages at once, so writing fresh memory through huge pages is several times
faster than through 4 KiB faults. In a VM whose balloon reports free memory to
its host (virtio-balloon *free page reporting*, feature bit 5), the guest hands
the host exactly its free blocks of 2 MiB and more, and the host discards their
backing: a huge-page fault takes such a block and the host faults all of it
back in (at ~3 s/GiB here), while a 4 KiB fault is served from the smaller free
fragments that were never reported. Measured on such a VM
(benchmarks/RESULTS.md, "Huge pages for fresh memory"): 1 GB read into advised
memory took 0.09-1.2 s depending on whether the freed blocks had been reported
yet, into 4 KiB pages 0.26-0.27 s every time.

So huge pages are advised unless the machine is such a guest;
``LOADER_HUGE_PAGES`` (yes/no) overrides the rule either way. Mapped parameters
(:mod:`loader._mapped_parameters`) write no fresh memory and are not affected.
"""

from __future__ import annotations

import functools
from pathlib import Path

from ._settings import HUGE_PAGES

__all__ = ["BALLOON_DRIVER", "FREE_PAGE_REPORTING_BIT", "advise_fresh_huge_pages", "balloon_reports_free_pages"]

BALLOON_DRIVER = Path("/sys/bus/virtio/drivers/virtio_balloon")
FREE_PAGE_REPORTING_BIT = 5
"""``VIRTIO_BALLOON_F_REPORTING``: the position of its character in a virtio device's ``features`` file."""


def balloon_reports_free_pages(driver: Path = BALLOON_DRIVER) -> bool:
    """Whether a virtio balloon device under ``driver`` negotiated free page reporting."""
    try:
        devices = sorted(driver.glob("virtio*"))
    except OSError:
        return False
    for device in devices:
        try:
            features = (device / "features").read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if len(features) > FREE_PAGE_REPORTING_BIT and features[FREE_PAGE_REPORTING_BIT] == "1":
            return True
    return False


@functools.cache
def _reporting_guest() -> bool:
    return balloon_reports_free_pages()


def advise_fresh_huge_pages() -> bool:
    """Whether to advise transparent huge pages for fresh memory a load fills (``LOADER_HUGE_PAGES``, else
    yes unless this is a guest whose balloon reports free pages to its host)."""
    chosen = HUGE_PAGES.read()
    return (not _reporting_guest()) if chosen is None else chosen
