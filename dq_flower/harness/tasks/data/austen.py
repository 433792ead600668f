"""Jane Austen's six novels, one device per novel (or per group of chapters).

Source: Debian's ``r-cran-janeaustenr`` (the R package ``janeaustenr`` 1.0.0, public-domain
texts from Project Gutenberg), read without R: its data live in an R lazy-load database,
``Rdata.rdx`` (a gzipped R serialization: each object's offset and length) and
``Rdata.rdb`` (each object a 4-byte big-endian length and its compressed R serialization),
parsed by the pip package ``rdata``. Each novel is a character vector of lines.

Chapters: a novel's text from one line starting ``Chapter``/``CHAPTER`` and a number
(arabic or roman) to the next, the heading included; the front matter before the first
chapter (title, author, Northanger Abbey's advertisement) is left out. Counted on the
packaged data (and pinned by a test): 269 chapters, 4,023,109 characters of chapter text.

Held-out text: per device, a seeded ``test_fraction`` of its chapters (at least one, and
at least one kept), drawn from ``(seed, device index)``; whole chapters, so no window of
held-out text overlaps one of training text.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import re
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dq_flower.extras import explain_missing

__all__ = ["AUSTEN_APT_PACKAGE", "DEFAULT_AUSTEN_DIR", "NOVELS", "TextDevice",
           "TextFederation", "find_austen_db", "read_novels", "split_chapters", "load_austen"]

AUSTEN_APT_PACKAGE = "r-cran-janeaustenr"
DEFAULT_AUSTEN_DIR = "/usr/lib/R/site-library/janeaustenr/data"
#: The novels' object names in the database, in order of publication.
NOVELS: tuple[str, ...] = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma",
                           "northangerabbey", "persuasion")
#: Largest decompressed object accepted from the database (the biggest novel is 1 MB).
MAX_OBJECT_BYTES = 1 << 26
_CHAPTER = re.compile(r"^chapter [\divxlc]", re.IGNORECASE)


@dataclass(frozen=True)
class TextDevice:
    """One device's text: its training and held-out chapters, each joined into one string."""

    name: str
    train: str
    test: str
    train_chapters: int
    test_chapters: int


@dataclass(frozen=True)
class TextFederation:
    """Devices holding text, in a fixed order; ``name`` says where the text comes from."""

    name: str
    devices: tuple[TextDevice, ...]

    @property
    def num_devices(self) -> int:
        """Number of devices."""
        return len(self.devices)


def find_austen_db(data_dir: str | os.PathLike[str] | None = None) -> tuple[Path, Path]:
    """The paths of ``Rdata.rdx`` and ``Rdata.rdb``: in ``data_dir``, else Debian's folder.

    ``FileNotFoundError`` names the apt package where they are missing.
    """
    folder = Path(data_dir).expanduser() if data_dir is not None else Path(DEFAULT_AUSTEN_DIR)
    rdx, rdb = folder / "Rdata.rdx", folder / "Rdata.rdb"
    if rdx.is_file() and rdb.is_file():
        return rdx, rdb
    raise FileNotFoundError(
        f"Jane Austen's novels (Rdata.rdx and Rdata.rdb) not found in {folder}. Install the "
        f"Debian package '{AUSTEN_APT_PACKAGE}' (apt-get install --no-install-recommends "
        f"{AUSTEN_APT_PACKAGE}, files in {DEFAULT_AUSTEN_DIR}), or point data_dir at a "
        "folder holding its data files.")


def _unserialize(raw: bytes, where: str) -> Any:
    """One R-serialized object, converted by ``rdata``; ``ValueError`` where it is not one."""
    with explain_missing("reading Jane Austen's novels (load_austen)"):
        import rdata  # the `text` extra: loaded when the novels are read

    try:
        with warnings.catch_warnings():  # a bare serialization: rdata says it assumed RDS
            warnings.simplefilter("ignore", UserWarning)
            return rdata.conversion.convert(rdata.parser.parse_data(raw))
    except Exception as exc:  # rdata raises many kinds for a malformed stream
        raise ValueError(f"{where}: not an R serialization ({type(exc).__name__}: "
                         f"{exc})") from None


def _inflate(entry: bytes, compression: int, where: str) -> bytes:
    """An ``.rdb`` entry's serialization: 4-byte length, (type byte,) compressed data."""
    if len(entry) < 5:
        raise ValueError(f"{where}: entry of {len(entry)} bytes is truncated")
    size = int.from_bytes(entry[:4], "big")
    if size > MAX_OBJECT_BYTES:
        raise ValueError(f"{where}: declares {size} bytes, over {MAX_OBJECT_BYTES}")
    body, kind = (entry[4:], b"z") if compression == 1 else (entry[5:], entry[4:5])
    try:
        if kind == b"0":
            raw = body
        elif kind in (b"z", b"1"):
            raw = zlib.decompressobj().decompress(body, size + 1)
        elif kind == b"2":
            raw = bz2.BZ2Decompressor().decompress(body, size + 1)
        elif kind == b"Z":
            raw = lzma.LZMADecompressor().decompress(body, size + 1)
        else:
            raise ValueError(f"unknown compression type {kind!r}")
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
        raise ValueError(f"{where}: cannot decompress ({exc})") from None
    if len(raw) != size:
        raise ValueError(f"{where}: declares {size} bytes, holds {len(raw)}")
    return raw


def read_novels(data_dir: str | os.PathLike[str] | None = None,
                names: Sequence[str] = NOVELS) -> dict[str, list[str]]:
    """The lines of each novel in ``names``, read from the lazy-load database.

    ``ValueError`` for a database of another kind, a missing novel or a novel that is not
    a vector of strings; ``FileNotFoundError`` as :func:`find_austen_db`.
    """
    rdx, rdb = find_austen_db(data_dir)
    with gzip.open(rdx, "rb") as f:
        try:
            index = _unserialize(f.read(MAX_OBJECT_BYTES), str(rdx))
        except (OSError, EOFError) as exc:
            raise ValueError(f"{rdx}: not a gzipped R serialization ({exc})") from None
    table = index.get("variables") if isinstance(index, dict) else None
    if not isinstance(table, dict):
        raise ValueError(f"{rdx}: not a lazy-load index (no 'variables')")
    flag = np.asarray(index.get("compressed", [True])).reshape(-1)
    compression = int(flag[0]) if flag.size == 1 else -1
    if compression not in (0, 1, 2, 3):
        raise ValueError(f"{rdx}: unknown 'compressed' value {flag.tolist()}")
    size = rdb.stat().st_size
    out: dict[str, list[str]] = {}
    with open(rdb, "rb") as f:
        for name in names:
            if name not in table:
                raise ValueError(f"{rdx}: no novel {name!r} (holds {sorted(table)})")
            where = np.asarray(table[name]).reshape(-1)
            if where.size != 2 or not 0 <= int(where[0]) <= int(where[0]) + int(where[1]) \
                    <= size:
                raise ValueError(f"{rdx}: {name!r} points outside {rdb} ({where.tolist()})")
            f.seek(int(where[0]))
            entry = f.read(int(where[1]))
            raw = entry if compression == 0 else _inflate(entry, compression, f"{rdb}: {name}")
            lines = _unserialize(raw, f"{rdb}: {name}")
            if not isinstance(lines, np.ndarray) or lines.ndim != 1 \
                    or lines.dtype.kind != "U":
                raise ValueError(f"{rdb}: {name!r} is not a vector of strings")
            out[name] = [str(s) for s in lines]
    return out


def split_chapters(lines: Sequence[str]) -> list[str]:
    """A novel's chapters, each its lines joined by newlines (the front matter left out)."""
    heads = [i for i, line in enumerate(lines) if _CHAPTER.match(line)]
    ends = [*heads[1:], len(lines)]
    return ["\n".join(lines[a:b]).strip("\n") + "\n" for a, b in zip(heads, ends, strict=True)]


def _groups(chapters: list[str], size: int | None) -> list[list[str]]:
    """Consecutive groups of ``size`` chapters (a last group of one joins the one before)."""
    if size is None or size >= len(chapters):
        return [chapters]
    groups = [chapters[i:i + size] for i in range(0, len(chapters), size)]
    if len(groups) > 1 and len(groups[-1]) < 2:
        last = groups.pop()
        groups[-1] = groups[-1] + last
    return groups


def _held_out(chapters: list[str], fraction: float, rng: np.random.Generator
              ) -> np.ndarray:
    """A seeded mask of held-out chapters: ``fraction`` of them, at least one, one kept."""
    n = len(chapters)
    held = min(n - 1, max(1, int(round(fraction * n))))
    mask = np.zeros(n, dtype=bool)
    mask[rng.permutation(n)[:held]] = True
    return mask


def load_austen(data_dir: str | os.PathLike[str] | None = None, *,
                chapters_per_device: int | None = None, test_fraction: float = 0.1,
                seed: int = 0) -> TextFederation:
    """The six novels as devices: one per novel, or per ``chapters_per_device`` chapters.

    Devices are named ``<novel>`` or ``<novel>-<k>`` (k counts a novel's groups from 0),
    in `NOVELS` order. ``test_fraction`` (in (0, 1)) of each device's chapters, drawn from
    ``(seed, device index)``, is its held-out text.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if chapters_per_device is not None and chapters_per_device < 2:
        raise ValueError("chapters_per_device must be at least 2 (a training and a held-out "
                         f"chapter), got {chapters_per_device}")
    novels = read_novels(data_dir)
    devices: list[TextDevice] = []
    for novel in NOVELS:
        chapters = split_chapters(novels[novel])
        if len(chapters) < 2:
            raise ValueError(f"{novel}: {len(chapters)} chapter(s) found; need at least 2")
        groups = _groups(chapters, chapters_per_device)
        for k, group in enumerate(groups):
            rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, len(devices)])
            mask = _held_out(group, test_fraction, rng)
            devices.append(TextDevice(
                novel if len(groups) == 1 else f"{novel}-{k}",
                "".join(c for c, m in zip(group, mask, strict=True) if not m),
                "".join(c for c, m in zip(group, mask, strict=True) if m),
                int((~mask).sum()), int(mask.sum())))
    return TextFederation("austen", tuple(devices))
