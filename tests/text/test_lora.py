"""Federated LoRA fine-tuning (``peft``): adapters-only uploads, the averaging, a round."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, RecordDict

pytest.importorskip("peft")

from dq_flower.accounting import MeasuredGrid, content_bytes  # noqa: E402
from dq_flower.harness.inprocess import InProcessGrid  # noqa: E402
from dq_flower.harness.lora.adapters import (  # noqa: E402
    LoraSettings,
    adapter_record,
    cosine_lr,
    load_adapters,
    merged,
    with_adapters,
)
from dq_flower.harness.lora.client import LocalTraining, lora_train  # noqa: E402
from dq_flower.harness.lora.compare import TextTask, run_method  # noqa: E402
from dq_flower.harness.lora.server import (  # noqa: E402
    held_out_windows,
    initial_adapters,
    lora_fedavg,
)
from dq_flower.harness.tasks.char_lm import CharTransformer  # noqa: E402

WINDOW = 16
TEXTS = ("It is a truth universally acknowledged, that a single man in possession " * 3,
         "The family of Dashwood had long been settled in Sussex. " * 5)


def _base() -> CharTransformer:
    torch.manual_seed(0)
    return CharTransformer(256, WINDOW, width=32, blocks=1, heads=2)


def _run(rounds: int = 1, steps: int = 2):
    base, settings = _base(), LoraSettings(rank=4, alpha=8)
    sent: list = []
    models = {k: with_adapters(base, settings) for k in range(len(TEXTS))}

    def train(msg, context):
        k = int(context.node_config["partition-id"])
        reply = lora_train(msg, context, TEXTS[k], model=models[k], window=WINDOW)
        sent.append((k, reply))
        return reply

    grid = MeasuredGrid(InProcessGrid(train, len(TEXTS)))
    initial = initial_adapters(base, settings)
    local = LocalTraining(steps=steps, batch_size=4, num_rounds=rounds)
    result = lora_fedavg(len(TEXTS)).start(grid=grid, initial_arrays=initial,
                                           num_rounds=rounds, train_config=local.config())
    return base, settings, initial, grid, sent, result


def test_a_device_uploads_its_adapters_alone():
    base, _, initial, grid, sent, _ = _run()
    for k, reply in sent:
        arrays = reply.content["arrays"]
        assert set(arrays) == set(initial)  # the adapters, nothing of the base model
        assert all("lora_A" in n or "lora_B" in n for n in arrays)
        tensors = sum(a.numpy().nbytes for a in arrays.values())
        assert tensors == sum(a.numpy().nbytes for a in initial.values())
        # the reply's bytes are the tensors' bytes plus the message's framing: each tensor
        # travels as a .npy file (a 128-byte header), under its name, shape and dtype
        npy = sum(len(a.data) for a in arrays.values())
        assert npy - tensors == 128 * len(arrays)
        skeleton = RecordDict({
            "arrays": ArrayRecord({n: Array(dtype=a.dtype, shape=a.shape, stype=a.stype,
                                            data=b"") for n, a in arrays.items()}),
            "metrics": reply.content["metrics"]})
        framing = content_bytes(reply.content) - npy - content_bytes(skeleton)
        assert 0 <= framing <= 8 * len(arrays)  # longer length prefixes of the nested fields
        assert grid.per_node("up")[101 + k] == content_bytes(reply.content)
    base_bytes = sum(p.numel() * 4 for p in base.parameters())
    assert grid.up_bytes < 0.5 * len(TEXTS) * base_bytes


def test_the_server_averages_the_adapters_weighted_by_windows():
    _, _, _, _, sent, result = _run()
    counts = {k: int(r.content["metrics"]["num-examples"]) for k, r in sent}
    assert counts == {0: len(TEXTS[0].encode()) // WINDOW, 1: len(TEXTS[1].encode()) // WINDOW}
    total = sum(counts.values())
    for name, array in result.arrays.items():
        expected = sum(counts[k] * r.content["arrays"][name].numpy() for k, r in sent) / total
        np.testing.assert_allclose(array.numpy(), expected, rtol=1e-5, atol=1e-7)


def test_a_round_trains_the_adapters_and_reports_its_flops():
    base, settings, initial, _, sent, result = _run(rounds=2, steps=3)
    b_before = [initial[n].numpy() for n in initial if "lora_B" in n]
    b_after = [result.arrays[n].numpy() for n in initial if "lora_B" in n]
    assert all(np.abs(a).max() == 0 for a in b_before)  # lora_B starts at zero
    assert any(np.abs(a).max() > 0 for a in b_after)
    flops = {float(r.content["metrics"]["train-flops"]) for _, r in sent}
    assert len(flops) == 1 and flops.pop() > 0  # the same steps and batch on every device
    model = with_adapters(base, settings)
    load_adapters(model, result.arrays)
    x = torch.tensor([list(TEXTS[0].encode()[:WINDOW])])
    base.eval()
    with torch.no_grad():
        assert not torch.allclose(merged(model)(x), base(x))


def test_adapters_act_only_through_the_merged_copy_in_eval_mode():
    # nn.TransformerEncoderLayer's fused eval path reads the base weights directly: the
    # wrapped model in eval mode ignores its adapters, the merged copy does not
    base = _base()
    model = with_adapters(base, LoraSettings(rank=4, alpha=8))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    x = torch.randint(0, 256, (2, WINDOW))
    model.train()
    trained_view = model(x).detach()
    with torch.no_grad():
        assert torch.allclose(merged(model).eval()(x), trained_view, atol=1e-4)
        assert not torch.allclose(base.eval()(x), trained_view, atol=1e-2)


def test_load_adapters_refuses_another_models_adapters():
    model = with_adapters(_base(), LoraSettings(rank=4, alpha=8))
    other = adapter_record(with_adapters(_base(), LoraSettings(rank=2, alpha=8)))
    with pytest.raises(ValueError, match="shape"):
        load_adapters(model, other)
    with pytest.raises(ValueError, match="not this model's"):
        load_adapters(model, ArrayRecord({"x": other[next(iter(other))]}))


def test_cosine_lr_runs_from_max_to_min():
    assert cosine_lr(0, 10, 1.0, 0.1) == pytest.approx(1.0)
    assert cosine_lr(10, 10, 1.0, 0.1) == pytest.approx(0.1)
    assert cosine_lr(5, 10, 1.0, 0.1) == pytest.approx(0.55)


@pytest.mark.parametrize("method", ["lora-fedavg", "lora-fedavg-qsgd2", "dq"])
def test_run_method_counts_every_round(method):
    names = ("a", "b")
    task = TextTask(names, TEXTS, held_out_windows(names, TEXTS, WINDOW, 2), WINDOW)
    out = run_method(method, task, _base(), rounds=2, lora=LoraSettings(rank=4, alpha=8),
                     local=LocalTraining(steps=2, batch_size=4, num_rounds=2),
                     dq_knobs={"max_server_steps": 10})
    history = out["history"]
    assert [h["round"] for h in history] == [0, 1, 2]
    assert history[0]["up_bytes"] == 0 and history[1]["up_bytes"] > 0
    assert all(np.isfinite(h["perplexity"]) for h in history)
    assert set(history[1]["device_flops"]) == set(names)
    if method == "dq":  # the devices train nothing, the server does
        assert sum(history[1]["device_flops"].values()) == 0
        assert history[1]["server_steps"] > 0
    else:
        assert all(f > 0 for f in history[1]["device_flops"].values())
    if method == "lora-fedavg-qsgd2":
        assert history[1]["up_bytes"] < 0.25 * out["adapter_bytes"] * len(names)
