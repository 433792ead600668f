"""The examples in README.md, examples/*/README.md and docs/ run, and the site builds.

Every fenced code block of ``README.md``, ``examples/*/README.md`` and ``docs/**/*.md``
(``docs/results/`` aside: those files are written by ``simulations/regenerate.py`` and hold
no code) has a language. Each
``python`` and ``bash`` block is an example, and either

* runs here: Python blocks one after the other, each in a fresh namespace, in one worker
  process; shell blocks with ``bash -euo pipefail``; both in a scratch folder that links to
  the repository's top-level entries (so ``examples/quickstart.py``, ``simulations/`` and
  ``.venv/bin/python`` resolve, and whatever an example writes stays in the scratch
  folder), blocks of a file in document order; or
* is preceded by ``<!-- not-run: REASON -->`` and skipped, with the reason shown.

Sizes are kept small by two documented mechanisms (see docs/development.md):

* ``<!-- run-small: OLD => NEW; OLD2 => NEW2 -->`` right before a block replaces each
  literal ``OLD`` with ``NEW`` before running it (each ``OLD`` must occur in the block);
* in the Python worker, Flower's ``flwr.simulation.run_simulation`` (which
  ``dq_flower.simulate`` calls too) runs the ServerApp on the in-process grid
  (:class:`dq_flower.harness.inprocess.InProcessGrid`), the same strategies and client code
  without starting Ray.

A file a page shows is written into it between ``<!-- inline: PATH -->`` and
``<!-- /inline -->`` (``simulations/inline_docs.py`` rewrites them; a stale one fails a
test), so the pages read as plain Markdown. A line ``--8<-- "path"`` inside a block
(pymdownx.snippets) would be replaced with that file, as the site does, but no page has one.
``toml`` blocks must parse. A Python block followed by ``It prints `TEXT``` or by ``Output
of ...`` and a ``text`` block documents its output: the test compares it with the whole
output of the run, line for line; a shell block followed by ``prints, ... (real output``
and a ``text`` block, with the first lines of its last command's output (timings aside). The
last test builds the site with ``mkdocs build --strict``
when mkdocs is installed (``make docs`` installs it).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYTHON_LANGS = {"python", "py"}
SHELL_LANGS = {"bash", "sh", "shell"}
OTHER_LANGS = {"text", "toml", "diff", "json", "yaml"}
PYTHON_TIMEOUT_S = 90  # one block
SHELL_TIMEOUT_S = 120  # one block
WORKER_TIMEOUT_S = 300  # every Python block together

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*(?P<kind>not-run|run-small)\s*:\s*(?P<arg>.*?)\s*-->\s*$")
ANY_DIRECTIVE = re.compile(r"<!--\s*(not-run|run-small)\b")
INLINE_END = "<!-- /inline -->"
SNIPPET = re.compile(r'^\s*--8<--\s+"(?P<path>[^":]+)(?::(?P<start>\d*)(?::(?P<end>\d*))?)?"\s*$')


@dataclass(frozen=True)
class Block:
    """One fenced code block of a Markdown file."""

    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    kind: str = ""  # "not-run", "run-small" or ""
    arg: str = ""
    after: str = ""  # the first non-empty line after the closing fence

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    def substitutions(self) -> list[tuple[str, str]]:
        if self.kind != "run-small":
            return []
        pairs = []
        for part in self.arg.split(";"):
            if part.strip():
                old, sep, new = part.partition("=>")
                assert sep, f"{self.id}: run-small needs 'OLD => NEW', got {part!r}"
                pairs.append((old.strip(), new.strip()))
        return pairs

    def runnable_code(self) -> str:
        code = self.code
        for old, new in self.substitutions():
            assert old in code, f"{self.id}: run-small text {old!r} is not in the block"
            code = code.replace(old, new)
        return code


def doc_files() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md")
                  if (ROOT / "docs" / "results") not in p.parents)
    return [ROOT / "README.md", *sorted((ROOT / "examples").glob("*/README.md")), *docs]


def resolve_snippets(code: str, where: str) -> str:
    out = []
    for line in code.splitlines():
        m = SNIPPET.match(line)
        if not m:
            out.append(line)
            continue
        path = ROOT / m["path"]
        assert path.is_file(), f"{where}: snippet {m['path']} does not exist"
        lines = path.read_text().splitlines()
        start = int(m["start"]) if m["start"] else 1
        end = int(m["end"]) if m["end"] else len(lines)
        out.extend(lines[start - 1:end])
    return "\n".join(out) + "\n"


def parse_blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path`` with the directive right above each, if any."""
    rel = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, lang = m["fence"], m["indent"], m["info"].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(fence[0] * len(fence)) and set(stripped) == {fence[0]}:
                break
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        kind = arg = ""
        if start > 0:
            d = DIRECTIVE.match(lines[start - 1])
            if d:
                kind, arg = d["kind"], d["arg"]
        code = textwrap.dedent("\n".join(body)) + "\n"
        if lang in PYTHON_LANGS | SHELL_LANGS:
            code = resolve_snippets(code, f"{rel}:{start + 1}")
        after = next((line.strip() for line in lines[i:]
                      if line.strip() and line.strip() != INLINE_END), "")
        blocks.append(Block(rel, start + 1, lang, code, kind, arg, after))
    return blocks


ALL_BLOCKS = [b for p in doc_files() for b in parse_blocks(p)]
PYTHON = [b for b in ALL_BLOCKS if b.lang in PYTHON_LANGS]
SHELL = [b for b in ALL_BLOCKS if b.lang in SHELL_LANGS]


def _params(blocks: list[Block]) -> list:
    return [pytest.param(b, id=b.id,
                         marks=[pytest.mark.skip(reason=f"not-run: {b.arg}")]
                         if b.kind == "not-run" else [])
            for b in blocks]


# ------------------------------------------------------------------ structure
def test_the_docs_have_examples():
    assert len(PYTHON) >= 10 and len(SHELL) >= 5, (len(PYTHON), len(SHELL))


def test_every_fenced_block_names_its_language():
    known = PYTHON_LANGS | SHELL_LANGS | OTHER_LANGS
    bad = [f"{b.id} ({b.lang or 'no language'})" for b in ALL_BLOCKS if b.lang not in known]
    assert not bad, ("every fenced block needs a language (python, bash, or text for "
                     f"output): {bad}")


def test_directives_sit_right_above_an_example():
    for path in doc_files():
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            if not (line.lstrip().startswith("<!--") and ANY_DIRECTIVE.search(line)):
                continue  # a directive is a line of its own; prose may quote one
            where = f"{path.relative_to(ROOT)}:{n + 1}"
            d = DIRECTIVE.match(line)
            assert d, f"{where}: malformed directive {line.strip()!r}"
            nxt = FENCE.match(lines[n + 1]) if n + 1 < len(lines) else None
            assert nxt and nxt["info"].lower() in PYTHON_LANGS | SHELL_LANGS, (
                f"{where}: a directive must be the line right above a python or bash block")
            if d["kind"] == "not-run":
                assert len(d["arg"].split()) >= 3, f"{where}: say why the block is not run"


def test_the_pages_read_as_plain_markdown():
    # README.md says so: a file a page shows is written into it, not an include line
    # (pymdownx.snippets), which plain Markdown shows as literal text
    includes = [f"{path.relative_to(ROOT)}:{n + 1}" for path in doc_files()
                for n, line in enumerate(path.read_text().splitlines()) if SNIPPET.match(line)]
    assert not includes, f"include lines; use <!-- inline: PATH --> markers: {includes}"
    # admonitions (!!! / ???) show as literal text outside the site: blockquotes instead
    admonitions = [f"{path.relative_to(ROOT)}:{n + 1}" for path in doc_files()
                   for n, line in enumerate(path.read_text().splitlines())
                   if re.match(r"(!!!|\?\?\?\+?) ", line)]
    assert not admonitions, f"admonitions; write a > **Title.** blockquote: {admonitions}"
    # a mkdocstrings directive is empty in plain Markdown: the page names help() for it
    for path in doc_files():
        text = path.read_text()
        flat = " ".join(text.split())
        missing = [name for name in re.findall(r"^::: ([\w.]+)", text, re.M)
                   if f"`help({name})`" not in flat]
        assert not missing, f"{path.relative_to(ROOT)}: say help(...) for {missing}"


def test_the_built_site_opens_from_files():
    # folder URLs (page/) need a web server; page.html links open from the file system
    assert re.search(r"^use_directory_urls: false$", (ROOT / "mkdocs.yml").read_text(), re.M)


def test_every_inlined_file_is_its_source_as_it_is_now():
    from simulations.inline_docs import MARK, stale_pages

    marks = [line for path in doc_files() for line in path.read_text().splitlines()
             if MARK.match(line)]
    assert len(marks) >= 20, len(marks)
    assert not stale_pages(), ("stale inlined files; run .venv/bin/python "
                               f"simulations/inline_docs.py: {stale_pages()}")


def test_run_small_substitutions_apply():
    for b in ALL_BLOCKS:
        if b.kind == "run-small":
            assert b.substitutions(), f"{b.id}: empty run-small"
            b.runnable_code()


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang == "toml"],
                         ids=lambda b: b.id)
def test_toml_blocks_parse(block):
    tomllib.loads(block.code)


def test_results_blocks_have_a_home():
    """regenerate.py and robustness.py splice into README.md or a docs page."""
    readme = (ROOT / "README.md").read_text()
    # the headline table's verdict, written in by inline_docs.py
    assert "<!-- inline: docs/results/digits-mlp/summary.md#verdict -->" in readme
    pages = "".join(p.read_text() for p in doc_files())
    marker_lines = [line for line in pages.splitlines()
                    if line.strip() == "<!-- results:robustness -->"]
    assert len(marker_lines) == 1, "robustness.py splices exactly one block"
    assert "<!-- results:robustness -->" in (ROOT / "docs" / "reliability.md").read_text()
    for summary in sorted((ROOT / "docs" / "results").glob("*/summary.md")):
        name = summary.parent.name
        assert (f"<!-- results:{name} -->" in readme
                or f"<!-- inline: docs/results/{name}/summary.md" in pages), name


# ------------------------------------------------------------------ running
@pytest.fixture(scope="module")
def sandbox():
    """A scratch folder whose top-level entries link to the repository's."""
    folder = Path(tempfile.mkdtemp(prefix="dq-docs-"))
    for entry in ROOT.iterdir():
        if entry.name not in {".git", "results", "site"}:
            (folder / entry.name).symlink_to(entry)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", MPLBACKEND="Agg",
               OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "examples" / "quickstart-dq"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


WORKER = r'''
import contextlib, io, json, signal, sys, time, traceback

import flwr.simulation
from flwr.app import Context, RecordDict

from dq_flower.harness.inprocess import InProcessGrid


def run_simulation_inprocess(server_app, client_app, num_supernodes, **_ignored):
    """Flower's run_simulation without Ray: the ServerApp on the in-process grid."""
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    server_app(InProcessGrid(client_app, num_supernodes), context)


flwr.simulation.run_simulation = run_simulation_inprocess


class BlockTimeout(Exception):
    pass


def on_alarm(signum, frame):
    raise BlockTimeout("the block ran past its time limit")


signal.signal(signal.SIGALRM, on_alarm)
blocks = json.loads(open(sys.argv[1]).read())
results = {}
for block in blocks:
    out = io.StringIO()
    t0 = time.perf_counter()
    signal.alarm(block["timeout"])
    try:
        with contextlib.redirect_stdout(out):
            scope = {"__name__": "__main__"}
            exec(compile(block["code"], block["id"], "exec"), scope)
            if block["app_nodes"]:  # a Flower app: run as flwr run would, on that many nodes
                run_simulation_inprocess(scope["server_app"], scope["client_app"],
                                         block["app_nodes"])
        error = ""
    except BaseException:
        error = traceback.format_exc()
    finally:
        signal.alarm(0)
    results[block["id"]] = {"error": error, "stdout": out.getvalue()[-20000:],
                            "seconds": round(time.perf_counter() - t0, 2)}
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)
'''


APP_NODES = re.compile(r'--federation-config "num-supernodes=(\d+)"')


def app_nodes(block: Block) -> int | None:
    """The nodes of a block that defines a Flower app and runs nothing (``flwr run .``).

    Such a block has a module-level ``server_app = ServerApp()`` and ``client_app =
    ClientApp()`` and no ``run_simulation``; the prose after it gives the ``flwr run``
    command, whose ``num-supernodes`` the test uses (on the in-process grid).
    """
    code = block.code
    if "run_simulation(" in code or not (re.search(r"^server_app = ServerApp\(", code, re.M)
                                         and re.search(r"^client_app = ClientApp\(", code, re.M)):
        return None
    page = (ROOT / block.path).read_text().splitlines()
    found = APP_NODES.search("\n".join(page[max(block.line - 12, 0):]))
    assert found, f"{block.id}: a Flower app's page names its flwr run --federation-config"
    return int(found[1])


def test_the_readme_quickstart_is_the_plugin_pages_app_and_runs_as_flower_documents():
    # the README shows no deprecated run_simulation: its app runs with flwr run .
    apps = [b for b in PYTHON if b.code.startswith("# dq_app.py")]
    assert [b.path for b in apps] == ["README.md", "docs/plugin.md"], [b.id for b in apps]
    assert apps[0].code == apps[1].code
    assert all(app_nodes(b) == 4 for b in apps)
    readme = (ROOT / "README.md").read_text()
    assert "run_simulation" not in readme and "flwr run ." in readme


@pytest.fixture(scope="module")
def python_results(sandbox):
    """Run every Python block that is not marked not-run, in one worker process."""
    todo = [{"id": b.id, "code": b.runnable_code(), "timeout": PYTHON_TIMEOUT_S,
             "app_nodes": app_nodes(b)} for b in PYTHON if b.kind != "not-run"]
    blocks_file, results_file = sandbox / ".docs-blocks.json", sandbox / ".docs-results.json"
    blocks_file.write_text(json.dumps(todo))
    try:
        done = subprocess.run([sys.executable, "-c", WORKER, str(blocks_file),
                               str(results_file)], cwd=sandbox, env=_env(),
                              capture_output=True, text=True, timeout=WORKER_TIMEOUT_S,
                              check=False)
        log = done.stderr
    except subprocess.TimeoutExpired as exc:
        log = f"the worker ran past {WORKER_TIMEOUT_S} s\n{exc.stderr or ''}"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    return results, log


@pytest.mark.parametrize("block", _params(PYTHON))
def test_python_example_runs(block, python_results):
    results, log = python_results
    assert block.id in results, f"the worker stopped before {block.id}:\n{log[-3000:]}"
    res = results[block.id]
    assert not res["error"], f"{res['error']}\nstdout:\n{res['stdout']}"


PRINTS = re.compile(r"^It prints `(?P<text>[^`]+)`")


def _documented_output(block: Block) -> str | None:
    """What the prose right after ``block`` says it prints, if it says so.

    ``It prints `TEXT``` after the block, or ``Output of ...`` followed by a ``text`` block.
    """
    m = PRINTS.match(block.after)
    if m:
        return m["text"]
    if block.after.startswith("Output of"):
        later = [b for b in ALL_BLOCKS if b.path == block.path and b.line > block.line]
        if later and later[0].lang == "text":
            return later[0].code.strip()
    return None


DOCUMENTED = [b for b in PYTHON if b.kind == "" and _documented_output(b) is not None]


def test_some_printed_outputs_are_checked():
    assert len(DOCUMENTED) >= 3, [b.id for b in DOCUMENTED]


def _lines(text: str) -> list[str]:
    """``text``'s lines without trailing spaces, blank lines at either end dropped."""
    return [line.rstrip() for line in text.strip("\n").splitlines()]


@pytest.mark.parametrize("block", _params(DOCUMENTED))
def test_documented_output_is_what_the_example_prints(block, python_results):
    # the whole output, line for line: a page that shows fewer lines than the example
    # prints (rounds it no longer shows) is as stale as one that shows other numbers
    results, log = python_results
    assert block.id in results, f"the worker stopped before {block.id}:\n{log[-3000:]}"
    expected = _documented_output(block)
    printed = results[block.id]["stdout"]
    assert expected is not None and _lines(expected) == _lines(printed), (
        f"{block.id} documents\n{expected}\nbut printed:\n{printed}")


NOVELS_ONLY = "needs the novels from the Debian package r-cran-janeaustenr"
NOVEL_BLOCKS = [b for b in PYTHON if b.kind == "not-run" and b.arg == NOVELS_ONLY]


def _austen_installed() -> bool:
    from dq_flower.harness.tasks.data.austen import DEFAULT_AUSTEN_DIR

    return Path(DEFAULT_AUSTEN_DIR).is_dir()


@pytest.mark.skipif(not _austen_installed(), reason=f"not-run: {NOVELS_ONLY}")
@pytest.mark.parametrize("block", NOVEL_BLOCKS, ids=lambda b: b.id)
def test_a_block_that_needs_only_the_novels_prints_what_the_page_shows(block, sandbox):
    # where the Debian package is installed, such a block runs and its output block (the
    # text block right after it) is what it prints, line for line
    done = subprocess.run([sys.executable, "-c", block.code], cwd=sandbox, env=_env(),
                          capture_output=True, text=True, timeout=PYTHON_TIMEOUT_S,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert block.after == "```text", f"{block.id}: its output block is missing"
    shown = next(b for b in ALL_BLOCKS if b.path == block.path and b.line > block.line)
    assert _lines(done.stdout) == _lines(shown.code), (shown.code, done.stdout)


def test_some_blocks_need_only_the_novels():
    assert NOVEL_BLOCKS, NOVELS_ONLY


def _shell_output(block: Block) -> str | None:
    """The first lines a shell block prints, where the prose after it says ``prints, ...
    (real output...`` and a ``text`` block follows."""
    if not (block.after.startswith("prints, ") and "(real output" in block.after):
        return None
    later = [b for b in ALL_BLOCKS if b.path == block.path and b.line > block.line]
    assert later and later[0].lang == "text", f"{block.id}: its output block is missing"
    return later[0].code


def _times(line: str) -> str:
    return re.sub(r"\bdone in \d+(\.\d+)? s\b", "done in # s", line)


def _shape(line: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "#", line)


def _check_shell_output(block: Block, stdout: str, mask) -> None:
    """The page's lines are what the block's last command printed first, under ``mask``."""
    expected = [mask(line) for line in _lines(_shell_output(block) or "")]
    printed = [mask(line) for line in _lines(stdout)]
    starts = [i for i, line in enumerate(printed) if line == expected[0]] or [0]
    assert printed[starts[-1]:starts[-1] + len(expected)] == expected, (
        f"{block.id}'s page shows\n" + "\n".join(expected) + "\nbut it printed\n" + stdout)


SHELL_DOCUMENTED = [b for b in SHELL if _shell_output(b) is not None]


@pytest.mark.parametrize("block", _params(SHELL))
def test_shell_example_runs(block, sandbox):
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.runnable_code()],
                          cwd=sandbox, env=_env(), capture_output=True, text=True,
                          timeout=SHELL_TIMEOUT_S, check=False)
    assert done.returncode == 0, (f"exit {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
                                  f"\n--- stderr\n{done.stderr[-3000:]}")
    if block in SHELL_DOCUMENTED:  # its last command's output: as shown, numbers aside where
        # run-small made the run smaller (the slow test below runs it as shown), else but for
        # its timings
        _check_shell_output(block, done.stdout, _shape if block.kind == "run-small" else _times)


def test_some_shell_outputs_are_checked():
    assert [b.path for b in SHELL_DOCUMENTED] == ["docs/compare.md"], SHELL_DOCUMENTED


@pytest.mark.slow  # 28 s: the size the page shows; the fast run above is the small version
@pytest.mark.parametrize("block", [b for b in SHELL_DOCUMENTED if b.kind == "run-small"],
                         ids=lambda b: b.id)
def test_shell_output_at_the_size_shown(block, tmp_path):
    for entry in ROOT.iterdir():
        if entry.name not in {".git", "results", "site"}:
            (tmp_path / entry.name).symlink_to(entry)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _check_shell_output(block, done.stdout, _times)


# ------------------------------------------------------------------ the site
def test_mkdocs_build_strict(tmp_path):
    mkdocs = Path(sys.executable).parent / "mkdocs"
    if not mkdocs.exists():
        pytest.skip("mkdocs is not installed: make docs installs the docs extra")
    done = subprocess.run([str(mkdocs), "build", "--strict", "--quiet", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert (tmp_path / "site" / "reference" / "strategies.html").is_file()


# ------------------------------------------------------------------ published ratios
REGEN = ROOT / "results" / "regen"
RATIO = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)x\b")
DEFAULTS = re.compile(r"(?<!not yet )\b[Aa]t (its|the) (current )?(package )?defaults\b")
HEADLINE_COMPETITORS = ("fedavg-qsgd2", "2-bit QSGD", "qsgd-tau5")


def _stats(run: str) -> dict[str, dict]:
    runs = json.loads((REGEN / run / "results.json").read_text())["runs"]
    return {r["label"]: r["stats"] for r in runs}


def _summary_cell(name: str, method: str, heading: str) -> str:
    """The cell of ``method``'s row under ``heading`` in a published summary's table."""
    from simulations.inline_docs import _cells

    lines = (ROOT / "docs" / "results" / name / "summary.md").read_text().splitlines()
    head = _cells(next(line for line in lines if line.startswith("| method |")))
    column = next(i for i, h in enumerate(head) if h.startswith(heading))
    return next(_cells(line) for line in lines if line.startswith(f"| {method} |"))[column]


def headline_ratios() -> dict[str, float]:
    """DQ at its defaults against the strongest competitor, from the results files."""
    from simulations.inline_docs import _to_bytes

    iid, dirichlet = (_stats("fmnist-wide-cnn-defaults")["dq"],
                      _stats("fmnist-wide-cnn-dirichlet-defaults")["dq"])
    qsgd2 = _stats("fmnist-wide-cnn-more")["fedavg-qsgd2"]["up_bytes_to_target"]
    rerun = _stats("fmnist-wide-cnn-dirichlet-fedavg-qsgd2")["fedavg-qsgd2"]
    return {
        "wide CNN, IID": qsgd2 / iid["up_bytes_to_target"],
        "wide CNN, Dirichlet, published competitor": (
            _to_bytes(_summary_cell("fmnist-wide-cnn-dirichlet", "fedavg-qsgd2", "uplink to"))
            / dirichlet["up_bytes_to_target"]),
        "wide CNN, Dirichlet, rerun competitor (a lower bound)": (
            rerun["total_up_bytes"] / dirichlet["up_bytes_to_target"]),
        "wide CNN, IID, uploading every row once (commit fc78b0d)": (
            _stats("fmnist-wide-cnn-upload-all")["upload-all"]["up_bytes_to_target"]
            / _stats("fmnist-wide-cnn-upload-all")["dq"]["up_bytes_to_target"]),
        # the published summaries' own ratio, from their exact bytes
        "digits, IID": float(_summary_cell("digits-mlp", "qsgd-tau5", "uplink vs")[:-1]),
        "digits, IID, fedavg-qsgd2": float(
            _summary_cell("digits-mlp", "fedavg-qsgd2", "uplink vs")[:-1]),
        "digits, Dirichlet": float(
            _summary_cell("digits-mlp-dirichlet", "qsgd-tau5", "uplink vs")[:-1]),
    }


def _spellings(ratio: float) -> set[str]:
    """``11.24`` -> {"11.2", "11"}: three and two significant digits."""
    return {f"{ratio:.3g}", f"{ratio:.2g}"}


def _sentences(path: Path) -> list[str]:
    """The prose sentences of a page, wrapped lines joined; a table row is one, its header's
    text before it (a column "at the defaults" speaks of each row)."""
    out = []
    for block in re.split(r"\n\s*\n", path.read_text()):
        rows = [line for line in block.splitlines() if line.lstrip().startswith("|")]
        out += rows[:1] + [f"{rows[0]} {row}" for row in rows[2:]]
        prose = " ".join(line.strip() for line in block.splitlines()
                         if not line.lstrip().startswith("|"))
        out += re.split(r"(?<=[.!?])\s+(?=[A-Z*`\[(])", prose)
    return out


def test_the_headline_ratios_are_those_of_the_results_files():
    ratios = headline_ratios()
    assert f"{ratios['wide CNN, IID']:.3g}" == "11.2"  # the README's headline
    for page in ("README.md", "docs/index.md", "docs/experiments/index.md",
                 "docs/experiments/dq-needs.md"):
        text = (ROOT / page).read_text()
        for name in ("wide CNN, IID", "wide CNN, Dirichlet, published competitor"):
            assert f"{ratios[name]:.3g}x" in text, (page, name, ratios[name])


def test_the_resnet18_page_and_index_state_the_published_ratio_and_bytes():
    # the prose around the inlined tables: DQ's and fedavg-qsgd2's bytes to 80%, the ratio
    ratio = _summary_cell("fmnist-resnet18", "fedavg-qsgd2", "uplink vs")
    dq_bytes = _summary_cell("fmnist-resnet18", "dq", "uplink to")
    qsgd2_bytes = _summary_cell("fmnist-resnet18", "fedavg-qsgd2", "uplink to")
    page = " ".join((ROOT / "docs/experiments/fmnist-resnet18.md").read_text().split())
    assert f"{ratio} DQ's bytes" in page and f"with {dq_bytes} of uplink" in page
    assert f"needs {qsgd2_bytes} at round" in page
    index = " ".join((ROOT / "docs/experiments/index.md").read_text().split())
    assert f"80% with {dq_bytes}, {ratio} below `fedavg-qsgd2`" in index


def _time_cell(name: str, method: str, link: str) -> str:
    """``method``'s simulated time to the target on ``link`` in a published summary."""
    from simulations.inline_docs import _cells

    lines = (ROOT / "docs" / "results" / name / "summary.md").read_text().splitlines()
    start = lines.index("## Time on links")
    head = _cells(next(line for line in lines[start:] if line.startswith("| method |")))
    row = next(_cells(line) for line in lines[start:] if line.startswith(f"| {method} |"))
    return row[head.index(link)]


def test_the_hapt_page_and_index_state_the_published_bytes_ratios_and_times():
    cell = functools.partial(_summary_cell, "hapt-cnn")
    dq_bytes = cell("dq", "uplink to")
    page = " ".join((ROOT / "docs/experiments/hapt.md").read_text().split())
    assert f"1,344 in all, {dq_bytes} of uplink" in page
    assert (f"{cell('upload-all', 'uplink to')}, {cell('upload-all', 'uplink vs')} DQ's bytes"
            in page)
    assert (f"{cell('fedavg-qsgd2', 'uplink to')} ({cell('fedavg-qsgd2', 'uplink vs')})"
            in page)
    assert f"{_time_cell('hapt-cnn', 'dq', 'lte')} on lte" in page
    assert f"`signsgd` needs {_time_cell('hapt-cnn', 'signsgd', 'lte')}" in page
    index = " ".join((ROOT / "docs/experiments/index.md").read_text().split())
    assert (f"DQ 85% with {dq_bytes}, {cell('upload-all', 'uplink vs')} below `upload-all` "
            f"and {cell('fedavg-qsgd2', 'uplink vs')} below `fedavg-qsgd2`" in index)


def test_the_readme_is_at_most_300_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def _git_has(commit: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT,
                          capture_output=True, check=False).returncode == 0


def _run_commit(run: str) -> str:
    return json.loads((REGEN / run / "results.json").read_text())["environment"]["git_commit"]


def test_the_readme_results_table_is_the_results_files():
    # every row of the README's "DQ at its defaults" table: DQ's bytes, the competitors'
    # bytes and ratios from the published files, the commit each ran at
    from dq_flower.compare import fmt_bytes

    text = (ROOT / "README.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()
            if line.startswith("  | ") and "commit" in line}
    cell = _summary_cell
    digits = rows["digits MLP, 4 IID clients, 90%"]
    assert f"| {cell('digits-mlp', 'dq', 'uplink to')}, round 1 |" in digits
    for method in ("upload-all", "fedavg-qsgd2"):
        assert (f"`{method}` {cell('digits-mlp', method, 'uplink to')} "
                f"({cell('digits-mlp', method, 'uplink vs')})") in digits
    summary_commit = re.search(r"commit ([0-9a-f]{7})", (
        ROOT / "docs/results/digits-mlp/summary.md").read_text())[1]
    assert f"commit {summary_commit} |" in digits
    ratios = headline_ratios()
    iid, dirichlet = (_stats("fmnist-wide-cnn-defaults")["dq"],
                      _stats("fmnist-wide-cnn-dirichlet-defaults")["dq"])
    wide = rows["wide CNN (D/d = 1,094), Fashion-MNIST, 10 IID clients, 85%"]
    assert f"| {fmt_bytes(iid['up_bytes_to_target'])}, round {iid['rounds_to_target']} |" in wide
    assert f"({ratios['wide CNN, IID']:.3g}x)" in wide
    assert f"commit {_run_commit('fmnist-wide-cnn-defaults')[:7]} |" in wide
    split = rows["the same, Dirichlet(0.1)"]
    assert (f"| {fmt_bytes(dirichlet['up_bytes_to_target'])}, round "
            f"{dirichlet['rounds_to_target']} |") in split
    assert f"({ratios['wide CNN, Dirichlet, published competitor']:.3g}x)" in split
    resnet = rows["ResNet-18 (D/d = 14,251), 5,000 rows, 5 clients, 80%"]
    assert f"| {cell('fmnist-resnet18', 'dq', 'uplink to')}, round 2 |" in resnet
    assert (f"{cell('fmnist-resnet18', 'fedavg-qsgd2', 'uplink to')} "
            f"({cell('fmnist-resnet18', 'fedavg-qsgd2', 'uplink vs')})") in resnet
    assert f"commit {_run_commit('fmnist-resnet18')[:7]} |" in resnet
    hapt = rows["HAPT: 21 people's phone sensors, tested on 9 others, 85%"]
    assert f"| {cell('hapt-cnn', 'dq', 'uplink to')}, round 1 |" in hapt
    for method in ("upload-all", "fedavg-qsgd2"):
        assert (f"`{method}` {cell('hapt-cnn', method, 'uplink to')} "
                f"({cell('hapt-cnn', method, 'uplink vs')})") in hapt
    assert f"commit {_run_commit('hapt-cnn')[:7]} |" in hapt
    for line in rows.values():  # every commit named is in the history
        assert all(_git_has(c) for c in re.findall(r"commit ([0-9a-f]{7,40})", line)), line


def test_every_commit_a_results_page_names_is_in_the_history():
    pages = [ROOT / "docs" / "changelog.md", *sorted((ROOT / "docs" / "experiments").glob(
        "*.md")), *sorted((ROOT / "docs" / "results").glob("*/summary.md"))]
    missing = [(p.relative_to(ROOT), c) for p in pages
               for c in set(re.findall(r"\bcommits? ([0-9a-f]{7,40})\b", p.read_text()))
               if not _git_has(c)]
    assert not missing, missing


def test_the_quickstart_prints_the_published_dq_rows_first_rounds():
    # a change to DQ's bytes changes the README quickstart's documented output (checked by
    # running it) and, until digits-mlp is regenerated, fails here: the table stays current
    from dq_flower.compare import fmt_bytes

    block = next(b for b in ALL_BLOCKS if b.path == "README.md"
                 and "examples/quickstart.py" in b.code)
    rows = {int(r.split()[0]): r.split() for r in _documented_output(block).splitlines()
            if r.strip() and r.split()[0].isdigit()}
    first, second = int(rows[1][2]), int(rows[2][2])
    assert _summary_cell("digits-mlp", "dq", "uplink to") == fmt_bytes(first)
    assert _summary_cell("digits-mlp", "dq", "total uplink") == fmt_bytes(first + second)
    readme = (ROOT / "README.md").read_text()
    assert f"byte for byte ({first:,} B)" in " ".join(readme.split())


def test_no_page_gives_dq_at_its_defaults_another_ratio():
    # a sentence about DQ at its (current) defaults against a headline competitor states
    # one of the ratios the results files give, on every page: no page contradicts another;
    # a table row counts as a sentence of its own, with its header's text
    allowed = set().union(*(_spellings(r) for r in headline_ratios().values()))
    wrong = []
    for path in doc_files():
        if path == ROOT / "docs" / "changelog.md":  # the figures later runs replaced
            continue
        for sentence in _sentences(path):
            if DEFAULTS.search(sentence) and any(c in sentence for c in HEADLINE_COMPETITORS):
                wrong += [f"{path.relative_to(ROOT)}: {m[1]}x in {sentence[:160]!r}"
                          for m in RATIO.finditer(sentence) if m[1] not in allowed]
    assert not wrong, f"ratios the results files do not give ({sorted(allowed)}): {wrong}"


def test_the_insecure_warning_the_deploy_page_shows_is_the_one_printed():
    # dq-flower deploy ... --insecure prints INSECURE_WARNING as one line (say())
    from dq_flower.deploy.process_commands import INSECURE_WARNING

    shown = [b.code.strip() for b in ALL_BLOCKS if b.path == "docs/deploy.md"
             and b.lang == "text" and "--insecure" in b.code]
    assert shown == [INSECURE_WARNING], shown


#: the scaling page's measurements of this machine that run in seconds: the script, and
#: the smaller run whose counts are the same (the timings are only the page's shape)
MEASURED = {"benchmarks/store_per_sample.py": [],
            "benchmarks/train_flops.py": [("--batch 8", "--batch 1"), ("--steps 2", "--steps 1"),
                                          ("--repeats 2", "--repeats 1")]}
TIMING = re.compile(r"samples/s|ms per step|GFLOP/s")


@pytest.mark.parametrize("script", sorted(MEASURED))
def test_the_scaling_pages_counts_are_what_the_benchmark_prints(script, sandbox):
    # docs/scaling.md's blocks (not run there: measurements of the machine); the bytes and
    # FLOPs they print are exact, their rates a timing (shape only)
    block = next(b for b in SHELL if b.path == "docs/scaling.md" and script in b.code)
    shown = next(b for b in ALL_BLOCKS if b.path == block.path and b.line > block.line)
    assert block.after == "```text" and shown.lang == "text", block.id
    code = block.code
    for old, new in MEASURED[script]:
        assert old in code, (block.id, old)
        code = code.replace(old, new)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=sandbox,
                          env=_env(), capture_output=True, text=True, timeout=SHELL_TIMEOUT_S,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]

    def mask(line: str) -> str:
        return _shape(line) if TIMING.search(line) else line

    assert ([mask(line) for line in _lines(done.stdout)]
            == [mask(line) for line in _lines(shown.code)]), (shown.code, done.stdout)


def test_the_certs_output_the_deploy_page_shows_is_what_the_command_prints(tmp_path):
    # docs/deploy.md runs `deploy certs` (test_shell_example_runs) and shows the output of
    # the same command with `--host 192.0.2.2`, line for line
    block = next(b for b in SHELL if b.path == "docs/deploy.md"
                 and b.code.startswith("dq-flower deploy certs "))
    assert block.after == "Observed (run with `--host 192.0.2.2`, that machine's address):"
    shown = next(b for b in ALL_BLOCKS if b.path == block.path and b.line > block.line)
    command = re.sub(r"( --host \S+)+", " --host 192.0.2.2", block.code.strip())
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=SHELL_TIMEOUT_S,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _lines(done.stdout) == _lines(shown.code), (shown.code, done.stdout)
