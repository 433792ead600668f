"""The Austen text federation: reading R's lazy-load database, chapters, held-out split."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from dq_flower.harness.tasks.data.austen import (
    AUSTEN_APT_PACKAGE,
    DEFAULT_AUSTEN_DIR,
    NOVELS,
    load_austen,
    read_novels,
    split_chapters,
)
from tests.text.austen_files import novel_lines, write_db

CHAPTERS = {"sensesensibility": 10, "prideprejudice": 12, "mansfieldpark": 9, "emma": 11,
            "northangerabbey": 4, "persuasion": 2}


@pytest.fixture
def small_db(tmp_path: Path) -> Path:
    return write_db(tmp_path / "db", {n: novel_lines(n, c, "CHAPTER" if c % 2 else "Chapter")
                                      for n, c in CHAPTERS.items()})


def test_reads_every_novel_line_for_line(small_db):
    novels = read_novels(small_db)
    assert list(novels) == list(NOVELS)
    assert novels["emma"] == novel_lines("emma", 11, "CHAPTER")


def test_chapters_start_at_their_headings_and_drop_the_front_matter():
    chapters = split_chapters(["TITLE", "", "CHAPTER I", "", "one", "", "Chapter 2", "two"])
    assert chapters == ["CHAPTER I\n\none\n", "Chapter 2\ntwo\n"]


def test_one_device_per_novel_with_a_seeded_held_out_split(small_db):
    fed = load_austen(small_db, test_fraction=0.25, seed=3)
    assert [d.name for d in fed.devices] == list(NOVELS)
    for dev in fed.devices:
        total = CHAPTERS[dev.name]
        assert dev.test_chapters == min(total - 1, max(1, round(0.25 * total)))
        assert dev.train_chapters + dev.test_chapters == total
        # every chapter is on exactly one side
        found = sorted(int(line.split()[1]) for part in (dev.train, dev.test)
                       for line in part.splitlines() if line.startswith(("Chapter", "CHAPTER")))
        assert found == list(range(1, total + 1))
    again = load_austen(small_db, test_fraction=0.25, seed=3)
    assert [d.test for d in again.devices] == [d.test for d in fed.devices]
    other = load_austen(small_db, test_fraction=0.25, seed=4)
    assert [d.test for d in other.devices] != [d.test for d in fed.devices]


def test_devices_per_group_of_chapters(small_db):
    fed = load_austen(small_db, chapters_per_device=4)
    names = [d.name for d in fed.devices]
    # 12 chapters: 3 groups of 4; 9: 4, 5 (a last group of one joins the one before)
    assert names.count("prideprejudice-2") == 1 and "prideprejudice-3" not in names
    nine = [d for d in fed.devices if d.name.startswith("mansfieldpark")]
    assert [d.train_chapters + d.test_chapters for d in nine] == [4, 5]
    assert "persuasion" in names  # 2 chapters: one device
    assert all(d.test_chapters >= 1 and d.train_chapters >= 1 for d in fed.devices)


def test_xz_compressed_database(tmp_path):
    folder = write_db(tmp_path / "xz", {n: novel_lines(n, 3) for n in NOVELS}, compression=3)
    assert read_novels(folder)["persuasion"] == novel_lines("persuasion", 3)


def test_without_rdata_the_error_names_the_text_extra(small_db, monkeypatch):
    monkeypatch.setitem(sys.modules, "rdata", None)  # as where it is not installed
    with pytest.raises(ModuleNotFoundError, match=r"install the 'text' extra.*\[text\]"):
        read_novels(small_db)


def test_missing_data_names_the_apt_package(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"apt-get install .*{AUSTEN_APT_PACKAGE}"):
        load_austen(tmp_path)


@pytest.mark.parametrize("bad, reason", [
    ("missing", "no novel 'emma'"),
    ("numbers", "'emma' is not a vector of strings"),
    ("outside", "'sensesensibility' points outside"),
    ("bomb", "declares .* bytes, over"),
    ("short", "declares .* bytes, holds"),
    ("garbage", "cannot decompress"),
])
def test_malformed_databases_are_refused_with_the_reason(tmp_path, bad, reason):
    novels: dict[str, object] = {n: novel_lines(n, 3) for n in NOVELS}
    if bad == "missing":
        del novels["emma"]
    if bad == "numbers":
        novels["emma"] = np.arange(5, dtype=np.int32)
    folder = write_db(tmp_path / bad, novels)
    rdb = folder / "Rdata.rdb"
    blob = bytearray(rdb.read_bytes())
    if bad == "outside":
        rdb.write_bytes(bytes(blob[:100]))
    entry = _entry(folder, "emma")
    if bad == "bomb":
        blob[entry:entry + 4] = (1 << 30).to_bytes(4, "big")
    if bad == "short":
        size = int.from_bytes(blob[entry:entry + 4], "big")
        blob[entry:entry + 4] = (size + 7).to_bytes(4, "big")
    if bad == "garbage":
        blob[entry + 4:entry + 12] = b"\xff" * 8
    if bad in ("bomb", "short", "garbage"):
        rdb.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=reason):
        read_novels(folder)


def _entry(folder: Path, name: str) -> int:
    """The offset of ``name``'s entry in the database (0 where it is absent)."""
    import gzip

    import rdata

    index = rdata.conversion.convert(rdata.parser.parse_data(
        gzip.decompress((folder / "Rdata.rdx").read_bytes())))
    where = index["variables"].get(name)
    return 0 if where is None else int(where[0])


@pytest.mark.skipif(not Path(DEFAULT_AUSTEN_DIR, "Rdata.rdb").is_file(),
                    reason=f"{AUSTEN_APT_PACKAGE} is not installed")
def test_the_packaged_novels():
    fed = load_austen()
    assert [d.name for d in fed.devices] == list(NOVELS)
    assert sum(d.train_chapters + d.test_chapters for d in fed.devices) == 269
    assert sum(len(d.train) + len(d.test) for d in fed.devices) == 4_023_109
    assert [d.test_chapters for d in fed.devices] == [5, 6, 5, 6, 3, 2]
    assert fed.devices[3].train.startswith("CHAPTER I\n\n\nEmma Woodhouse, handsome, clever")
