"""The Python documentation as plain text: a corpus to pretrain a small model on.

Source: Debian's ``python3.11-doc`` (``apt-get install python3.11-doc``), whose HTML pages
lie under ``/usr/share/doc/python3.11/html``. Each page's text is read with the standard
library's ``html.parser``: the contents of ``script`` and ``style`` elements and of the
navigation bars (``div`` elements of class ``related``, ``sphinxsidebar`` or ``footer``)
are left out, block elements (paragraphs, headings, list items, ...) start a new line, runs
of blank space inside a line become one space, and blank lines are dropped.
Pages are read in sorted path order, so the text is the same on every machine with the same
package.

As a federation (:func:`load_python_docs`): one device per section of the documentation (a
top-level folder of the pages: ``library``, ``c-api``, ``reference``, ``howto``,
``tutorial``, ``faq`` by default), its pages' text in sorted path order; whole pages, drawn
in a seeded order until they hold a tenth of its characters (at least one page, and at
least one kept), are its held-out text. A device's ``train_chapters`` and
``test_chapters`` count pages.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from html.parser import HTMLParser
from pathlib import Path

import numpy as np

from dq_flower.harness.tasks.data.austen import TextDevice, TextFederation

__all__ = ["PYDOCS_APT_PACKAGE", "DEFAULT_PYDOCS_DIR", "PYDOCS_SECTIONS", "html_text",
           "python_docs_text", "load_python_docs"]

PYDOCS_APT_PACKAGE = "python3.11-doc"
DEFAULT_PYDOCS_DIR = "/usr/share/doc/python3.11/html"
_SKIPPED_TAGS = frozenset({"script", "style"})
_SKIPPED_CLASSES = frozenset({"related", "sphinxsidebar", "footer"})
#: Elements that start a new line of text where the page does not break the line itself.
_BLOCKS = frozenset({"p", "div", "section", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt",
                     "dd", "pre", "tr", "br", "table", "blockquote"})
#: The sections a federation of the docs has by default, one device each: the library and
#: C API references, the language reference, the how-tos, the tutorial and the FAQ.
PYDOCS_SECTIONS: tuple[str, ...] = ("library", "c-api", "reference", "howto", "tutorial",
                                    "faq")
_SPACE = re.compile(r"[ \t\r\f\v]+")


class _Text(HTMLParser):
    """Collects a page's text outside skipped elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip: list[str] = []  # the tags of the skipped elements we are inside

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCKS:
            self.parts.append("\n")
        classes = set((dict(attrs).get("class") or "").split())
        if self._skip:
            if tag == self._skip[-1]:
                self._skip.append(tag)  # nested element of the same tag: count it
        elif tag in _SKIPPED_TAGS or (tag == "div" and classes & _SKIPPED_CLASSES):
            self._skip.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if self._skip and tag == self._skip[-1]:
            self._skip.pop()
        if tag in _BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_text(page: str) -> str:
    """The text of one HTML page: one line per non-blank line, spaces collapsed."""
    parser = _Text()
    parser.feed(page)
    parser.close()
    lines = (_SPACE.sub(" ", line).strip() for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


def _missing(folder: Path) -> FileNotFoundError:
    return FileNotFoundError(
        f"no HTML pages under {folder}; install Debian's {PYDOCS_APT_PACKAGE} "
        f"(apt-get install {PYDOCS_APT_PACKAGE}) or pass the folder of the pages")


def python_docs_text(root: str | os.PathLike[str] | None = None,
                     max_chars: int | None = None) -> str:
    """The Python documentation's pages as text, in sorted path order, one page a paragraph.

    ``max_chars`` stops reading once that many characters are gathered (the text is cut to
    it). ``FileNotFoundError`` names the Debian package where no page is found.
    """
    folder = Path(root if root is not None else DEFAULT_PYDOCS_DIR)
    pages = sorted(folder.rglob("*.html")) if folder.is_dir() else []
    if not pages:
        raise _missing(folder)
    texts: list[str] = []
    total = 0
    for page in pages:
        text = html_text(page.read_text(encoding="utf-8", errors="replace"))
        if text:
            texts.append(text)
            total += len(text) + 2
        if max_chars is not None and total >= max_chars:
            break
    joined = "\n\n".join(texts)
    return joined if max_chars is None else joined[:max_chars]


def load_python_docs(root: str | os.PathLike[str] | None = None, *,
                     sections: Sequence[str] = PYDOCS_SECTIONS, test_fraction: float = 0.1,
                     seed: int = 0) -> TextFederation:
    """The documentation as devices, one per section (a top-level folder of the pages).

    A device's text is its section's pages (``*.html`` under the folder, at any depth) in
    sorted path order, one page a paragraph as in :func:`python_docs_text`; its held-out
    text is whole pages, drawn in an order seeded by ``(seed, device index)`` until they
    hold ``test_fraction`` of the section's characters (at least one page, and at least one
    kept), so a section of a few long pages still has held-out text to score.
    ``FileNotFoundError`` where a section has fewer than two pages with text.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    folder = Path(root if root is not None else DEFAULT_PYDOCS_DIR)
    devices = []
    for k, section in enumerate(sections):
        where = folder / section
        pages = sorted(where.rglob("*.html")) if where.is_dir() else []
        texts = [t for t in (html_text(p.read_text(encoding="utf-8", errors="replace"))
                             for p in pages) if t]
        if len(texts) < 2:
            raise (_missing(where) if not texts else FileNotFoundError(
                f"{where}: one page with text; a device needs at least two (one held out)"))
        n = len(texts)
        order = np.random.default_rng([int(seed) & 0xFFFFFFFF, k]).permutation(n)
        sizes = np.array([len(texts[i]) for i in order])
        # pages in the seeded order until test_fraction of the section's characters
        held = int(np.searchsorted(np.cumsum(sizes), test_fraction * sizes.sum())) + 1
        mask = np.zeros(n, dtype=bool)
        mask[order[:min(n - 1, held)]] = True
        devices.append(TextDevice(
            section, "\n\n".join(t for t, m in zip(texts, mask, strict=True) if not m),
            "\n\n".join(t for t, m in zip(texts, mask, strict=True) if m),
            int((~mask).sum()), int(mask.sum())))
    return TextFederation("python-docs", tuple(devices))
