"""The Python documentation as plain text: a corpus to pretrain a small model on.

Source: Debian's ``python3.11-doc`` (``apt-get install python3.11-doc``), whose HTML pages
lie under ``/usr/share/doc/python3.11/html``. Each page's text is read with the standard
library's ``html.parser``: the contents of ``script`` and ``style`` elements and of the
navigation bars (``div`` elements of class ``related``, ``sphinxsidebar`` or ``footer``)
are left out, block elements (paragraphs, headings, list items, ...) start a new line, runs
of blank space inside a line become one space, and blank lines are dropped.
Pages are read in sorted path order, so the text is the same on every machine with the same
package.
"""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path

__all__ = ["PYDOCS_APT_PACKAGE", "DEFAULT_PYDOCS_DIR", "html_text", "python_docs_text"]

PYDOCS_APT_PACKAGE = "python3.11-doc"
DEFAULT_PYDOCS_DIR = "/usr/share/doc/python3.11/html"
_SKIPPED_TAGS = frozenset({"script", "style"})
_SKIPPED_CLASSES = frozenset({"related", "sphinxsidebar", "footer"})
#: Elements that start a new line of text where the page does not break the line itself.
_BLOCKS = frozenset({"p", "div", "section", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt",
                     "dd", "pre", "tr", "br", "table", "blockquote"})
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


def python_docs_text(root: str | os.PathLike[str] | None = None,
                     max_chars: int | None = None) -> str:
    """The Python documentation's pages as text, in sorted path order, one page a paragraph.

    ``max_chars`` stops reading once that many characters are gathered (the text is cut to
    it). ``FileNotFoundError`` names the Debian package where no page is found.
    """
    folder = Path(root if root is not None else DEFAULT_PYDOCS_DIR)
    pages = sorted(folder.rglob("*.html")) if folder.is_dir() else []
    if not pages:
        raise FileNotFoundError(
            f"no HTML pages under {folder}; install Debian's {PYDOCS_APT_PACKAGE} "
            f"(apt-get install {PYDOCS_APT_PACKAGE}) or pass the folder of the pages")
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
