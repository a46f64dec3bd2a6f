"""Whether fresh memory is advised for huge pages: the rule reads the virtio balloon's features.

In a guest whose balloon reports free pages (feature bit 5), huge-page faults re-fault the host and are slower
than 4 KiB ones (benchmarks/RESULTS.md, "Huge pages for fresh memory"); elsewhere huge pages are advised.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loader import _huge_pages
from loader._huge_pages import balloon_reports_free_pages
from loader.io import advise_fresh_huge_pages


def _balloon(root: Path, *features: str) -> Path:
    for index, bits in enumerate(features):
        device = root / f"virtio{index}"
        device.mkdir(parents=True)
        (device / "features").write_text(bits + "\n", encoding="ascii")
    return root


def test_free_page_reporting_is_bit_5_of_a_balloon_device_s_features(tmp_path: Path) -> None:
    assert balloon_reports_free_pages(_balloon(tmp_path / "on", "0110010100000000"))
    assert not balloon_reports_free_pages(_balloon(tmp_path / "off", "0110000100000000"))
    assert balloon_reports_free_pages(_balloon(tmp_path / "second", "0000", "0000010000000000"))


def test_no_balloon_or_an_unreadable_one_reports_nothing(tmp_path: Path) -> None:
    assert not balloon_reports_free_pages(tmp_path / "absent")
    assert not balloon_reports_free_pages(_balloon(tmp_path / "short", "0110"))
    (tmp_path / "odd" / "virtio0").mkdir(parents=True)  # no features file
    assert not balloon_reports_free_pages(tmp_path / "odd")


@pytest.mark.parametrize("reporting", [True, False])
def test_unset_the_rule_decides_and_the_variable_overrides_it(reporting: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_huge_pages, "_reporting_guest", lambda: reporting)
    monkeypatch.delenv("LOADER_HUGE_PAGES", raising=False)
    assert advise_fresh_huge_pages() is (not reporting)
    monkeypatch.setenv("LOADER_HUGE_PAGES", "1")
    assert advise_fresh_huge_pages() is True
    monkeypatch.setenv("LOADER_HUGE_PAGES", "no")
    assert advise_fresh_huge_pages() is False
