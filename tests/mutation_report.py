"""Summarise a mutmut run (``make mutate``): kill rate per module and the surviving mutants.

Run from the folder mutmut ran in (the one holding ``mutants/``)::

    python tests/mutation_report.py [--diffs]

A mutant counts as killed when a test failed on it, or it timed out; "survived" and "no
tests" (no selected test runs the mutated function) are the ones left alive. With
``--diffs`` each survivor is printed with the line it changed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict

KILLED = {"killed", "timeout", "caught by type check", "segfault"}
ALIVE = {"survived", "no tests"}
LINE = re.compile(r"^\s*(\S+): (.+)$")


def module_of(mutant: str) -> str:
    """``dq_flower.dq.server.store.xǁSampleStoreǁadd__mutmut_3`` -> ``dq_flower.dq.server.store``.
    """
    return re.split(r"\.x[_ǁ]", mutant, maxsplit=1)[0]


def changed_line(mutant: str) -> str:
    """The mutated line, ``- old`` / ``+ new``, from mutmut's own diff (best effort)."""
    try:
        from mutmut.__main__ import find_mutant, get_diff_for_mutant
    except ImportError:
        return ""
    try:
        diff = get_diff_for_mutant(mutant, path=find_mutant(mutant).path)
    except Exception:  # noqa: BLE001  (a report, not a check)
        return ""
    lines = [ln for ln in diff.splitlines()
             if ln[:1] in "-+" and not ln.startswith(("---", "+++"))]
    return " | ".join(ln.strip() for ln in lines[:2])


def main(argv: list[str]) -> int:
    mutmut = shutil.which("mutmut") or str(
        __import__("pathlib").Path(sys.executable).with_name("mutmut"))
    # (mutmut may exit non-zero after printing every result: the lines are what counts)
    out = subprocess.run([mutmut, "results", "--all", "true"], capture_output=True,
                         text=True, check=False).stdout
    status = {m.group(1): m.group(2) for m in map(LINE.match, out.splitlines()) if m}
    per_module: dict[str, Counter] = defaultdict(Counter)
    for mutant, st in status.items():
        per_module[module_of(mutant)][st] += 1
    print(f"{'module':34} {'mutants':>7} {'killed':>6} {'alive':>5} {'not run':>7} "
          f"{'kill rate':>9}")
    total = Counter()
    for module in sorted(per_module):
        c = per_module[module]
        total.update(c)
        killed, alive = sum(c[s] for s in KILLED), sum(c[s] for s in ALIVE)
        run = killed + alive
        rate = f"{100 * killed / run:.1f}%" if run else "-"
        print(f"{module:34} {sum(c.values()):7} {killed:6} {alive:5} "
              f"{sum(c.values()) - run:7} {rate:>9}")
    killed, alive = sum(total[s] for s in KILLED), sum(total[s] for s in ALIVE)
    if killed + alive:
        print(f"{'all':34} {sum(total.values()):7} {killed:6} {alive:5} "
              f"{sum(total.values()) - killed - alive:7} "
              f"{100 * killed / (killed + alive):8.1f}%")
    survivors = sorted(m for m, st in status.items() if st in ALIVE)
    print(f"\n{len(survivors)} surviving mutants (`mutmut show NAME` for the diff):")
    for mutant in survivors:
        extra = f"  {changed_line(mutant)}" if "--diffs" in argv else ""
        print(f"  {mutant} [{status[mutant]}]{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
