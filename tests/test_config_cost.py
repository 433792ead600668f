"""What reading a config and one ``CompressedUpdates`` round cost: Python calls, code lines.

Calls are counted by tracing (``sys.setprofile``): every Python function entered, the
package's own counted apart. The bounds hold the measured figures with a margin; they
fail where the config path grows back (before one reader and the presets as config
subclasses, validating the ``fedavg-qsgd2`` run config below took 7,636 calls and a round
2,249 calls in the package, a ``GradientConfig`` rebuilt for every reply).
"""

from __future__ import annotations

import ast
import io
import logging
import tokenize
from collections import Counter
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import FedAvg

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.methods import validate_run_config
from tests.compression.digits_app import Net, make_app
from tests.tracing import PACKAGE, trace


def traced(fn) -> tuple[int, Counter]:
    """``fn()``'s Python calls: all of them, and the package's by module."""
    found = trace(fn)
    return found.total, found.ours


def test_the_tracer_counts_calls():
    def inner():
        return 1

    total, ours = traced(lambda: [inner() for _ in range(10)])
    assert total >= 11 and not ours  # the lambda, ten calls; none in the package


def test_validating_a_run_config_takes_a_few_hundred_calls():
    run_config = {"method": "fedavg-qsgd2"}
    validate_run_config(run_config)  # the first reading resolves each knob's type
    total, ours = traced(lambda: validate_run_config(run_config))
    assert total <= 600, (total, ours.most_common(5))  # measured: 378


def test_a_compressed_updates_round_stays_within_700_calls_in_the_package():
    """The server's side of one round: its train messages, then four replies aggregated."""
    logging.getLogger("flwr").setLevel(logging.WARNING)
    try:
        torch.manual_seed(0)
        arrays = ArrayRecord(Net().state_dict())
        strategy = dq_flower.CompressedUpdates(FedAvg(fraction_evaluate=0.0), codec="qsgd",
                                               codec_params={"levels": 1, "bucket": 64})
        grid = InProcessGrid(make_app([dq_flower.compression_mod]), 4)
        config = ConfigRecord({"lr": 0.05})
        first = list(strategy.configure_train(1, arrays, config, grid))
        strategy.aggregate_train(1, list(grid.send_and_receive(first)))  # round 1: warm
        sent: list = []
        _, configure = traced(lambda: sent.extend(strategy.configure_train(2, arrays, config,
                                                                           grid)))
        replies = list(grid.send_and_receive(sent))
        _, aggregate = traced(lambda: strategy.aggregate_train(2, replies))
    finally:
        logging.getLogger("flwr").setLevel(logging.INFO)
    calls = configure + aggregate
    assert len(replies) == 4 and strategy.round_figures(2)["rejected"] == 0
    assert sum(calls.values()) <= 700, calls.most_common(8)  # measured: 491
    config_code = sum(n for path, n in calls.items() if "config" in path or "codec_choice"
                      in path)
    assert config_code <= 20, calls.most_common(8)  # measured: 8 (67 when knob reads were calls)


def code_lines(path: Path) -> int:
    """Lines holding code: docstrings, comments and blank lines left out."""
    text = path.read_text()
    docs: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None),
                                                          ast.Constant) \
                    and isinstance(first.value.value, str):
                docs.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
            tokenize.DEDENT, tokenize.ENDMARKER)
    lines = {line for tok in tokenize.generate_tokens(io.StringIO(text).readline)
             if tok.type not in skip for line in range(tok.start[0], tok.end[0] + 1)}
    return len(lines - docs)


def test_code_lines_count_code_only(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text('"""Doc.\n\nMore."""\n\n# a comment\nx = (1,\n     2)\n\n\ndef f():\n'
                    '    """Doc."""\n    return x  # trailing\n')
    assert code_lines(path) == 4


def test_the_config_module_is_15_percent_below_the_three_it_replaced():
    # knob.py, knobs.py and config.py held 424 code lines; the one module holds what is
    # left of them (codec parameters went to codecs/params.py, the docs' knob table to
    # simulations/inline_docs.py, from_run_config's reading to server/base.py)
    assert code_lines(Path(PACKAGE) / "config.py") <= 0.85 * 424


def test_the_config_code_as_a_whole_shrank():
    # every module of knobs, groups, method configs and their reading: 940 code lines
    # before (knob, knobs, config, dq/config, baselines/config, compression/config,
    # harness/method_registry)
    modules = ("config.py", "codec_choice.py", "codecs/params.py", "dq/config.py",
               "baselines/config.py", "compression/config.py", "harness/method_registry.py")
    assert sum(code_lines(Path(PACKAGE) / m) for m in modules) <= 0.92 * 940
