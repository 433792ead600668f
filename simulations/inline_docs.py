"""Keep the files the docs show written into the pages, so that they read as plain Markdown.

A page shows a file, or lines of it, between two markers::

    <!-- inline: examples/quickstart.py -->
    ```python
    ...the file, as it is...
    ```
    <!-- /inline -->

A Markdown file (a results summary) goes in without a fence; ``PATH:START:END`` takes lines
START to END (1-based, either may be empty: ``summary.md:2:`` drops the title), and
``PATH#verdict`` a results summary's short verdict table: DQ and the three methods that
reached the target with the fewest uplink bytes, from the summary's main table;
``dq_flower/dq/config.py#knobs:DQConfig`` the knob table generated from that config class's
fields (:func:`knob_table`: key, default, meaning).

    .venv/bin/python simulations/inline_docs.py          # rewrite every region
    .venv/bin/python simulations/inline_docs.py --check  # list the stale ones (exit 1)

``tests/test_docs.py`` fails on a stale region; ``simulations/regenerate.py`` rewrites the
pages after it publishes new summaries.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"^<!-- inline: (?P<path>[^\s:#]+)(?::(?P<start>\d*):(?P<end>\d*)"
                  r"|#(?P<part>verdict|knobs:\w+))? -->$")
END = "<!-- /inline -->"
LANGS = {".py": "python", ".toml": "toml", ".sh": "bash", ".json": "json"}
#: columns of the verdict table, by their heading's start in the summary's main table
VERDICT_COLUMNS = ("method", "best acc", "rounds to", "uplink to", "uplink vs dq")


def pages() -> list[Path]:
    """README.md and every page under docs/ but the generated docs/results/."""
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md")
                  if (ROOT / "docs" / "results") not in p.parents)
    return [ROOT / "README.md", *docs]


def region(mark: re.Match[str]) -> list[str]:
    """The lines a marker stands for (fenced unless the file is Markdown)."""
    path = ROOT / mark["path"]
    lines = path.read_text().splitlines()
    if mark["part"] == "verdict":
        return ["", *verdict_table(lines), ""]
    if mark["part"] and mark["part"].startswith("knobs:"):
        return ["", *knobs_table(mark["path"], mark["part"].split(":", 1)[1]), ""]
    start = int(mark["start"]) if mark["start"] else 1
    end = int(mark["end"]) if mark["end"] else len(lines)
    body = lines[start - 1:end]
    if path.suffix == ".md":
        return ["", *body, ""]
    return [f"```{LANGS.get(path.suffix, 'text')}", *body, "```"]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _to_bytes(text: str) -> float:
    """``1.54 MB`` -> 1.54e6; anything else (``not reached``) -> infinity."""
    m = re.fullmatch(r"([\d.,]+) (B|kB|MB|GB)", text)
    scale = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}
    return float(m[1].replace(",", "")) * scale[m[2]] if m else float("inf")


def verdict_table(summary: list[str]) -> list[str]:
    """DQ's row and the three cheapest rows to the target of the summary's first table."""
    start = next(i for i, line in enumerate(summary) if line.startswith("| method |"))
    head = _cells(summary[start])
    columns = [next(i for i, h in enumerate(head) if h.startswith(c)) for c in VERDICT_COLUMNS]
    rows = []
    for line in summary[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(_cells(line))
    uplink = columns[3]
    dq = [r for r in rows if r[0] == "dq"]
    others = sorted((r for r in rows if r[0] != "dq"), key=lambda r: _to_bytes(r[uplink]))
    chosen = dq + [r for r in others if _to_bytes(r[uplink]) < float("inf")][:3]
    out = ["| " + " | ".join(head[i] for i in columns) + " |",
           "|---|" + "---:|" * (len(columns) - 1)]
    out += ["| " + " | ".join(r[i] for i in columns) + " |" for r in chosen]
    return out


def knobs_table(path: str, class_name: str) -> list[str]:
    """The knob table of config class ``class_name`` of the module at ``path``."""
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    return knob_table(getattr(module, class_name))


def knob_table(cls: type, defaults: dict[str, str] | None = None) -> list[str]:
    """Markdown rows ``| key | default | meaning |`` of the knobs of ``cls`` with a meaning.

    Its own knobs first, then its groups'; ``defaults`` replaces some keys' default column.
    """
    from dq_flower.config import knobs_of  # the package, only for the pages that show one

    found_all = knobs_of(cls)
    own = [n for n in found_all if n in vars(cls)
           and not any(n in vars(base) for base in cls.__mro__[1:])]
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for found in (found_all[n] for n in [*own, *(n for n in found_all if n not in own)]):
        shown = (defaults or {}).get(found.key)
        if shown is None:
            value = found.unset if found.default is None and found.has_unset else found.default
            value = str(value) if isinstance(value, Mapping) else value
            shown = (f"`{str(value).lower()}`" if isinstance(value, bool) else
                     (f"`{value}`" if value else '`""`') if isinstance(value, str) else
                     f"`{value:g}`" if isinstance(value, float) else f"`{value}`")
            shown += " (not set)" if found.default is None else ""
        if found.doc:
            rows.append(f"| `{found.key}` | {shown} | {found.doc} |")
    return rows


def inline(text: str, where: str = "") -> str:
    """``text`` with every marked region rewritten from its file."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        out.append(lines[i])
        mark = MARK.match(lines[i])
        i += 1
        if not mark:
            continue
        end = next((j for j in range(i, len(lines)) if lines[j] == END), None)
        if end is None:
            raise ValueError(f"{where}:{i}: {lines[i - 1]} has no {END}")
        out += [*region(mark), END]
        i = end + 1
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def stale_pages() -> list[str]:
    """The pages whose regions differ from their files."""
    return [str(p.relative_to(ROOT)) for p in pages()
            if inline(p.read_text(), str(p)) != p.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only list the stale pages")
    args = parser.parse_args(argv)
    stale = stale_pages()
    if args.check:
        print("\n".join(stale))
        return 1 if stale else 0
    for rel in stale:
        page = ROOT / rel
        page.write_text(inline(page.read_text(), rel))
        print(f"rewrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
