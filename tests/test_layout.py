"""The package's layout: arrows point one way.

- No server module imports a client module (not even lazily inside a function).
- The plugin (everything outside ``harness/``, ``compare/``, ``deploy/`` and ``cli.py``)
  never imports the harness, compare or deploy.
- Module-level imports have no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dq_flower

ROOT = Path(dq_flower.__file__).parent

SERVER = {"dq_flower.dq.strategy", "dq_flower.dq.planner", "dq_flower.dq.store",
          "dq_flower.dq.rows", "dq_flower.dq.identity", "dq_flower.baselines.strategy",
          "dq_flower.server", "dq_flower.server.common", "dq_flower.accounting",
          "dq_flower.compression.strategy"}
CLIENT = {"dq_flower.dq.client", "dq_flower.dq.scoring", "dq_flower.dq.client_model",
          "dq_flower.baselines.client", "dq_flower.client",
          "dq_flower.client.evaluate", "dq_flower.node", "dq_flower.data_input",
          "dq_flower.compression.mod"}
OUTSIDE_PLUGIN = ("dq_flower.harness", "dq_flower.compare", "dq_flower.deploy",
                  "dq_flower.cli")


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("dq_flower")}


MODULES = {_name(p): p for p in ROOT.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The module an import names (``pkg.mod.func`` -> ``pkg.mod``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_no_server_module_imports_a_client_module():
    bad = [(mod, imp) for mod in SERVER for imp in _imports(MODULES[mod], False)
           if _resolve(imp) in CLIENT]
    assert not bad, bad


def test_the_plugin_never_imports_the_harness():
    # the package root re-exports the harness's simulate and RunResult for convenience
    allowed = ("dq_flower.harness.history", "dq_flower.harness.simulate")
    plugin = [m for m in MODULES if not _under(m, OUTSIDE_PLUGIN)]
    bad = [(mod, imp) for mod in plugin for imp in _imports(MODULES[mod], False)
           if _under(imp, OUTSIDE_PLUGIN)
           and not (mod == "dq_flower" and _under(imp, allowed))]
    assert not bad, bad


def test_module_level_imports_have_no_cycle():
    graph = {m: {r for i in _imports(p, True) if (r := _resolve(i)) and r != m}
             for m, p in MODULES.items()}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own submodules
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join([*stack, node, nxt]))
            if nxt not in state:
                visit(nxt, [*stack, node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_the_checker_sees_a_forbidden_import(tmp_path):
    # the parser must find lazy imports, or the first test could not fail
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    from dq_flower.dq.client import dq_train\n")
    assert _resolve(next(iter(i for i in _imports(path, False)
                               if i.endswith("dq_train")))) == "dq_flower.dq.client"
    assert not _imports(path, True)
