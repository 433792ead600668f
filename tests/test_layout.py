"""The package's layout: arrows point one way.

Every rule counts every import statement of a module: at module level, inside functions
(lazy imports) and under ``TYPE_CHECKING``.

- No server module (``dq_flower.server``, ``dq_flower.dq.server``, a strategy) imports a
  client module (``dq_flower.dq.client``, the client functions and mods), and no client
  module imports a server module; what both ends share lives in neutral modules
  (``dq_flower.wire``, ``dq_flower.codecs``, ``dq_flower.seeding``, ``dq_flower.dq.config``).
- Nothing in ``dq_flower/wire/`` imports a method (``dq``, ``baselines``,
  ``compression``), the server or a config class: the wire formats sit below the methods
  that use them, and every format both ends read lives there.
- The plugin (everything outside ``harness/``, ``compare/``, ``deploy/``, ``cli.py`` and
  ``cli_common.py``) never imports the harness, compare or deploy; the package root alone
  re-exports the harness's ``simulate`` and ``RunResult``.
- The imports have no cycle (a package and its own submodules aside).
- No module is over :data:`MAX_MODULE_LINES` lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dq_flower

ROOT = Path(dq_flower.__file__).resolve().parent

#: Server modules: these and everything under :data:`SERVER_PACKAGES`.
SERVER = {"dq_flower.baselines.strategy", "dq_flower.accounting",
          "dq_flower.compression.strategy", "dq_flower.harness.server_app"}
SERVER_PACKAGES = ("dq_flower.server", "dq_flower.dq.server")
#: Client modules: these and everything under :data:`CLIENT_PACKAGES`.
CLIENT = {"dq_flower.client_state", "dq_flower.update_coding",
          "dq_flower.baselines.client", "dq_flower.client",
          "dq_flower.client.evaluate", "dq_flower.node", "dq_flower.data_input",
          "dq_flower.compression.mod", "dq_flower.harness.client_app",
          "dq_flower.harness.fedavg_client"}
CLIENT_PACKAGES = ("dq_flower.dq.client",)
WIRE = ("dq_flower.wire",)
#: What the wire layer never imports: the methods and every config class.
POLICY = ("dq_flower.baselines", "dq_flower.dq", "dq_flower.compression",
          "dq_flower.server", "dq_flower.config", "dq_flower.codec_choice")
OUTSIDE_PLUGIN = ("dq_flower.harness", "dq_flower.compare", "dq_flower.deploy",
                  "dq_flower.cli", "dq_flower.cli_common")


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(path: Path) -> str | None:
    """The package a relative import in ``path`` starts from (``None`` outside the tree)."""
    if ROOT not in path.resolve().parents:
        return None
    name = _name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    package = _package(path)
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x, from .mod import y
                if package is None:
                    continue
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("dq_flower")}


MODULES = {_name(p): p for p in ROOT.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The module an import names (``pkg.mod.func`` -> ``pkg.mod``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str) -> set[str]:
    """The modules ``module`` imports anywhere in its text, itself and its package aside."""
    found = {_resolve(i) for i in _imports(MODULES[module], False)}
    return {m for m in found if m and not (m == module or module.startswith(m + ".")
                                           or m.startswith(module + "."))}


def _is_server(module: str) -> bool:
    return module in SERVER or _under(module, SERVER_PACKAGES)


def _is_client(module: str) -> bool:
    return module in CLIENT or _under(module, CLIENT_PACKAGES)


def test_the_listed_modules_exist():
    missing = sorted(m for m in SERVER | CLIENT if m not in MODULES)
    missing += [p for p in SERVER_PACKAGES + CLIENT_PACKAGES + WIRE if p not in MODULES]
    assert not missing, missing


def test_no_server_module_imports_a_client_module():
    bad = [(mod, imp) for mod in MODULES if _is_server(mod) for imp in _imported(mod)
           if _is_client(imp)]
    assert not bad, bad


def test_no_client_module_imports_a_server_module():
    bad = [(mod, imp) for mod in MODULES if _is_client(mod) for imp in _imported(mod)
           if _is_server(imp)]
    assert not bad, bad


def test_the_wire_layer_imports_no_method_and_no_config():
    bad = [(mod, imp) for mod in MODULES if _under(mod, WIRE) for imp in _imported(mod)
           if _under(imp, POLICY)]
    assert not bad, bad


def test_the_wire_layer_holds_every_encode_decode_pair():
    # the formats both ends read live in wire/, not beside one end's policy
    found = {mod for mod in MODULES for name in ("held", "dq_batch", "spec", "gradient",
                                                 "compressed_update")
             if mod.rsplit(".", 1)[-1] == name}
    assert found and all(_under(mod, WIRE) for mod in found), sorted(found)


def test_the_plugin_never_imports_the_harness():
    # the package root re-exports the harness's simulate and RunResult for convenience
    allowed = ("dq_flower.harness.history", "dq_flower.harness.simulate")
    plugin = [m for m in MODULES if not _under(m, OUTSIDE_PLUGIN)]
    bad = [(mod, imp) for mod in plugin for imp in _imports(MODULES[mod], False)
           if _under(imp, OUTSIDE_PLUGIN)
           and not (mod == "dq_flower" and _under(imp, allowed))]
    assert not bad, bad


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack, node, nxt]
            if nxt not in state and (found := visit(nxt, [*stack, node])):
                return found
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [])):
            return found
    return None


def test_imports_have_no_cycle_lazy_ones_included():
    graph = {m: _imported(m) for m in MODULES}
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


@pytest.mark.parametrize("source, forbidden", [
    ("def f():\n    from dq_flower.dq.client.train import dq_train\n", "dq_flower.dq.client.train"),
    ("def f():\n    import dq_flower.server.common\n", "dq_flower.server.common"),
])
def test_the_checker_sees_a_lazy_import(tmp_path, source, forbidden):
    # the parser must find lazy imports, or the rules above could not fail on them
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert forbidden in {_resolve(i) for i in _imports(path, False)}
    assert not _imports(path, True)


def test_the_checker_resolves_relative_imports():
    found = {_resolve(i) for i in _imports(ROOT / "codecs" / "qsgd.py", False)}
    assert {"dq_flower.codecs.bitpack", "dq_flower.codecs.registry"} <= found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _unexplained_local_imports(path: Path) -> list[int]:
    """Lines of function-local imports with no reason next to them.

    A local import is kept only to defer something heavy or optional (PyTorch, Ray, the
    server side, torchvision, ...): it says so on its line or the line above, or sits in
    the ``try`` of an optional dependency.
    """
    lines = path.read_text().splitlines()
    tree = ast.parse(path.read_text())
    in_try = {id(s) for t in ast.walk(tree) if isinstance(t, ast.Try) for s in t.body}
    out = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in in_try:
                i = node.lineno - 1
                while i and lines[i - 1].strip().startswith(("import ", "from ")):
                    i -= 1  # a block of imports under one comment
                above = lines[i - 1].strip() if i else ""
                if "#" not in lines[node.lineno - 1] and not above.startswith("#"):
                    out.append(node.lineno)
    return out


def test_every_local_import_says_why_it_is_local():
    bad = {name: lines for name, path in MODULES.items()
           if (lines := _unexplained_local_imports(path))}
    assert not bad, bad


def test_the_local_import_check_sees_a_bare_one(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    import copy\n    return copy\n\n\ndef g():\n"
                    "    import torch  # PyTorch: deferred\n")
    assert _unexplained_local_imports(path) == [2]


#: Lines a module of the package may have: one job each, small enough to read at once.
MAX_MODULE_LINES = 450


def test_no_module_is_over_450_lines():
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, long

