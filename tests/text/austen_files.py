"""Small R lazy-load databases in the format of ``r-cran-janeaustenr``'s, for the tests."""

from __future__ import annotations

import gzip
import lzma
import zlib
from pathlib import Path

import numpy as np
import rdata


def serialize(obj: object) -> bytes:
    """``obj`` as R serializes it (XDR, version 3), as the database holds each object."""
    return rdata.unparser.unparse_data(rdata.conversion.convert_python_to_r_data(obj),
                                       file_type="rds")


def novel_lines(name: str, chapters: int, heading: str = "Chapter") -> list[str]:
    """A short novel: a title, then ``chapters`` chapters of two paragraphs each."""
    lines = [name.upper(), "", "By Jane Austen", ""]
    for k in range(1, chapters + 1):
        lines += [f"{heading} {k}", "", f"{name} chapter {k} opens here.", "",
                  f"It ends in {name}, chapter {k}.", ""]
    return lines


def write_db(folder: Path, novels: dict[str, object], compression: int = 1) -> Path:
    """``Rdata.rdx`` and ``Rdata.rdb`` holding ``novels`` (R's compress 1 zlib, 3 xz)."""
    folder.mkdir(parents=True, exist_ok=True)
    blob, where = b"", {}
    for name, value in novels.items():
        raw = serialize(np.asarray(value) if isinstance(value, list) else value)
        head = len(raw).to_bytes(4, "big")
        entry = head + zlib.compress(raw) if compression == 1 else head + b"Z" + lzma.compress(raw)
        where[name] = np.array([len(blob), len(entry)], dtype=np.int32)
        blob += entry
    (folder / "Rdata.rdb").write_bytes(blob)
    index = {"variables": where, "references": {},
             "compressed": np.array([compression], dtype=np.int32) if compression != 1
             else np.array([True])}
    (folder / "Rdata.rdx").write_bytes(gzip.compress(serialize(index)))
    return folder
