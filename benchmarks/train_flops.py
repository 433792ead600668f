"""Sustained FLOP/s of this machine on a model's training step, one core by default.

Counts the model's FLOPs per sample (forward + backward, ``FlopCounterMode``, as the time
model does: :func:`dq_flower.compare.devices.model_flops`), times ``--steps`` SGD steps
of ``--batch`` rows on ``--threads`` threads after a warm-up, and prints the FLOPs per
sample, the seconds per step and the sustained GFLOP/s: the figure behind the
``laptop-core`` compute profile.

Usage: python benchmarks/train_flops.py [--model wide-cnn] [--batch 32] [--steps 40]
       python benchmarks/train_flops.py --model torchvision:resnet18 --shape 3,224,224
           --classes 1000 --batch 8 --steps 2 --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wide-cnn",
                        help="a model name of the package, or torchvision:NAME (e.g. "
                             "torchvision:resnet18, ImageNet's ResNet-18)")
    parser.add_argument("--shape", default="1,28,28", help="one sample's shape")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    from dq_flower.compare.devices import model_flops
    from dq_flower.harness.tasks import make_model

    torch.set_num_threads(args.threads)
    shape = tuple(int(s) for s in args.shape.split(","))
    if args.model.startswith("torchvision:"):
        import torchvision  # only for a torchvision model

        model = getattr(torchvision.models, args.model.split(":", 1)[1])(
            num_classes=args.classes)
    else:
        model = make_model(args.model, shape, args.classes)
    flops = model_flops(model, shape)
    size = 1
    for s in shape:
        size *= s
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch, size, generator=gen)
    if args.model.startswith("torchvision:"):
        x = x.reshape(args.batch, *shape)  # torchvision's models take image tensors
    y = torch.randint(0, args.classes, (args.batch,), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    per_step = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        per_step.append((time.perf_counter() - t0) / args.steps)
    best = min(per_step)
    print(f"model {args.model}: {flops.forward / 1e6:.2f} MFLOP forward, "
          f"{flops.train / 1e6:.2f} MFLOP forward+backward per sample")
    print(f"{args.threads} thread(s), batch {args.batch}: {best * 1e3:.1f} ms per step "
          f"(best of {args.repeats}; median {statistics.median(per_step) * 1e3:.1f} ms)")
    print(f"sustained: {flops.train * args.batch / best / 1e9:.1f} GFLOP/s "
          f"(median {flops.train * args.batch / statistics.median(per_step) / 1e9:.1f})")


if __name__ == "__main__":
    main()
