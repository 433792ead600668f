"""CPU speed-ups of a server step, side by side: channels-last, bf16 autocast, torch.compile.

For one model (the wide CNN on 1x28x28 by default, the one whose server phases cost the most
time in the published runs), every variant trains from the same weights on the same
minibatches (random images and labels, seeded) with the server's step (SGD 0.05, momentum
0.9, weight decay 5e-4, minibatches of 64), and prints its median step time, the ratio to
the plain fp32 step, and the loss after the last step (a variant that changes the training
shows it there). ``torch.compile``'s first steps (its compile time) are printed apart and
left out of its median. Nothing here is switched on in the package: a variant is only worth
it where this prints a ratio well below 1 at the same loss.

Usage: python benchmarks/cpu_step_options.py [--model wide-cnn] [--steps 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from torch import nn

from dq_flower.harness.tasks import make_model

VARIANTS = ("fp32", "channels-last", "bf16-autocast", "compile")


def run(variant: str, model_name: str, steps: int, seed: int) -> tuple[float, float, float]:
    """(median step seconds, first-steps seconds, last loss) of one variant."""
    torch.manual_seed(seed)
    model = make_model(model_name, (1, 28, 28), 10, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    batches = [(torch.rand(64, 784, generator=gen), torch.randint(10, (64,), generator=gen))
                for _ in range(steps)]
    if variant == "channels-last":
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    step_model = torch.compile(model) if variant == "compile" else model
    loss_fn = nn.CrossEntropyLoss()
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if variant == "bf16-autocast"
                else contextlib.nullcontext())
    times, loss = [], float("nan")
    for x, y in batches:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            out = step_model(x)
            value = loss_fn(out.float(), y)
        value.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        loss = float(value.detach())
    warm = 3 if variant == "compile" else 1
    return statistics.median(times[warm:]), sum(times[:warm]), loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wide-cnn")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variant", action="append", choices=VARIANTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for variant in args.variant or VARIANTS:
        runs = [run(variant, args.model, args.steps, seed=0) for _ in range(args.repeats)]
        results[variant] = (statistics.median(r[0] for r in runs),
                            statistics.median(r[1] for r in runs), runs[0][2])
    base = results.get("fp32", next(iter(results.values())))[0]
    print(f"{'variant':<14} {'step ms':>8} {'vs fp32':>8} {'first steps s':>14} {'last loss':>10}")
    for variant, (step, first, loss) in results.items():
        print(f"{variant:<14} {step * 1e3:>8.1f} {step / base:>8.2f} {first:>14.2f} "
              f"{loss:>10.4f}")


if __name__ == "__main__":
    main()
