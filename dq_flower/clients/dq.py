"""Client side of data quantization: select, quantize, compensate, reply.

State kept across rounds in ``Context.state``:
- ``dq-uploaded``: a mask of the local samples already uploaded (not sent again unless
  ``resend``);
- ``dq-ef``: the error-feedback residual of a biased compensation codec;
- ``dq-grad-ef``: the error-feedback state of a biased codec in gradient rounds
  (``upload-mode`` gradient or auto).

Each is kept as it was before and after the last round it served, so replies are
idempotent per round: a server that replays a round after a crash gets the same reply.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from ..codecs import ErrorFeedback, make
from ..config import DQConfig, TaskConfig, from_mapping
from ..dq_wire import GRADIENT_KEY, encode_batch
from ..runtime import (
    MODEL_KEY,
    build_model,
    client_data,
    load_model_record,
    node_partition,
    round_rng,
    task_info,
    weighted_loss_grad,
)
from ..selection import select

__all__ = ["train", "quantizer_for", "score_candidates"]

UPLOADED_KEY = "dq-uploaded"
EF_KEY = "dq-ef"
GRAD_EF_KEY = "dq-grad-ef"


def quantizer_for(cfg: DQConfig, info_channels: int = 0, dither_seed: int | None = None):
    """The ``uniform`` data quantizer configured by ``cfg``."""
    params = {"bits": cfg.bits, "stochastic": cfg.stochastic, "entropy": cfg.entropy_coder}
    if cfg.per_channel and info_channels > 1:
        params["per_channel"] = info_channels
    if cfg.dither and dither_seed is not None:
        params["dither_seed"] = int(dither_seed)
    return make("uniform", **params)


def score_candidates(
    scorer: str, model: torch.nn.Module | None, x: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """Importance of each candidate: ``uniform``, ``loss`` or ``gradnorm`` (last layer).

    ``gradnorm`` uses the closed form of the last linear layer's per-sample gradient norm,
    ``||softmax(z) - onehot(y)|| * sqrt(1 + ||h||^2)``, with ``h`` the layer's input.
    """
    if scorer == "uniform" or x.shape[0] == 0:
        return np.ones(x.shape[0])
    assert model is not None
    dev = next(model.parameters()).device
    xt = torch.as_tensor(x, dtype=torch.float32).to(dev)
    yt = torch.as_tensor(y, dtype=torch.long).to(dev)
    was_training = model.training
    model.eval()
    captured: dict[str, torch.Tensor] = {}
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    hook = last.register_forward_hook(lambda _m, inp, _o: captured.__setitem__("h", inp[0]))
    try:
        with torch.no_grad():
            scores = []
            for i in range(0, xt.shape[0], 2048):
                logits = model(xt[i:i + 2048])
                yb = yt[i:i + 2048]
                if scorer == "loss":
                    scores.append(torch.nn.functional.cross_entropy(logits, yb, reduction="none"))
                else:
                    err = torch.softmax(logits, 1)
                    err[torch.arange(yb.shape[0]), yb] -= 1
                    h = captured["h"].reshape(yb.shape[0], -1)
                    scores.append(err.norm(dim=1) * torch.sqrt(1 + (h * h).sum(1)))
    finally:
        hook.remove()
        model.train(was_training)
    return torch.cat(scores).double().cpu().numpy()


def _state_before(context: Context, key: str, server_round: int) -> dict[str, np.ndarray]:
    """Arrays of state entry ``key`` as they were before ``server_round``.

    Each entry keeps its arrays before and after the last round it served, so a round the
    server replays (after a crash) gets the same reply as the first time.
    """
    rec = context.state.array_records.get(key)
    meta = context.state.config_records.get(key + "-round")
    if rec is None or meta is None:
        return {}
    which = "before/" if int(meta["round"]) == server_round else "after/"
    return {name[len(which):]: arr.numpy().copy()
            for name, arr in rec.items() if name.startswith(which)}


def _save_state(context: Context, key: str, server_round: int,
                before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> None:
    arrays = {f"before/{k}": Array(np.ascontiguousarray(v)) for k, v in before.items()}
    arrays.update({f"after/{k}": Array(np.ascontiguousarray(v)) for k, v in after.items()})
    context.state[key] = ArrayRecord(arrays)
    context.state[key + "-round"] = ConfigRecord({"round": server_round})


def _encode(codec, vector: np.ndarray, rng: np.random.Generator, context: Context,
            key: str, server_round: int):
    """Encode ``vector``, through error feedback kept under ``key`` for a biased codec."""
    if not codec.biased:
        return codec.encode(vector, rng)
    ef = ErrorFeedback(codec)
    ef_before = _state_before(context, key, server_round)
    if ef_before:
        ef.load_state_dict(ef_before)
    payload = ef.encode(vector, rng)
    _save_state(context, key, server_round, ef_before, ef.state_dict())
    return payload


def _gradient_round(msg: Message, context: Context, cfg: DQConfig, task: TaskConfig,
                    server_round: int, pid: int, rng: np.random.Generator, t0: float) -> Message:
    """Reply to a gradient round: a coded minibatch gradient at the server's model."""
    if MODEL_KEY not in msg.content.array_records:
        raise ValueError("a gradient round needs the model; the server did not send it")
    info = task_info(task)
    x, y = client_data(context, task)
    if x.shape[0] == 0:
        raise ValueError(f"partition {pid} is empty")
    model = build_model(task, info)
    load_model_record(model, msg.content.array_records[MODEL_KEY])
    size = min(cfg.gradient_batch_size, x.shape[0])
    idx = np.sort(rng.choice(x.shape[0], size=size, replace=False))
    loss, grad = weighted_loss_grad(model, x[idx], y[idx], np.full(size, 1.0 / size))
    codec = make(cfg.gradient_codec, **cfg.gradient_codec_kwargs)
    payload = _encode(codec, grad, rng, context, GRAD_EF_KEY, server_round)
    content = RecordDict({GRADIENT_KEY: payload.to_record()})
    content["metrics"] = MetricRecord({
        "num-examples": int(x.shape[0]),
        "partition-id": int(pid),
        "train-loss": float(loss),
        "up-payload-bits": int(payload.nbits),
        "client-time-s": time.perf_counter() - t0,
    })
    return Message(content=content, reply_to=msg)


def train(msg: Message, context: Context) -> Message:
    """Handle one DQ round: upload quantized samples (and a compensation) for this node."""
    t0 = time.perf_counter()
    config = dict(msg.content["config"].items())
    task = from_mapping(TaskConfig, config)
    cfg = from_mapping(DQConfig, config)
    server_round = int(config["server-round"])
    round_seed = int(config.get("round-seed", task.seed))
    pid, _ = node_partition(context, task)
    rng = round_rng(round_seed, server_round, pid)
    if config.get("round-mode", "data") == "gradient":
        return _gradient_round(msg, context, cfg, task, server_round, pid, rng, t0)
    info = task_info(task)
    x, y = client_data(context, task)

    before = _state_before(context, UPLOADED_KEY, server_round).get("mask")
    uploaded = (before.astype(bool) if before is not None and before.size == x.shape[0]
                else np.zeros(x.shape[0], dtype=bool))
    mask_before = uploaded.copy()
    candidates = np.arange(x.shape[0]) if cfg.resend else np.flatnonzero(~uploaded)

    model = None
    if MODEL_KEY in msg.content.array_records:
        model = build_model(task, info)
        load_model_record(model, msg.content.array_records[MODEL_KEY])
    scores = score_candidates(cfg.scorer, model, x[candidates], y[candidates])
    sel = select(scores, cfg.budget, cfg.selection_rule, rng, cfg.score_threshold)
    chosen = candidates[sel.indices]
    n_cand = max(int(candidates.size), 1)
    represents = sel.weights * n_cand  # 1 / pi_i: original samples each row stands for

    channels = info.input_shape[0] if len(info.input_shape) == 3 else 0
    quantizer = quantizer_for(cfg, channels, dither_seed=int(rng.integers(2**31)))
    xb = x[chosen]
    samples = quantizer.encode(xb, rng)

    compensation = None
    if cfg.compensation != "none" and chosen.size:
        if model is None:
            raise ValueError("compensation needs the model; the server did not send it")
        xq = quantizer.decode(samples)  # exactly the points the server will decode
        _, g_true = weighted_loss_grad(model, xb, y[chosen], sel.weights)
        _, g_quant = weighted_loss_grad(model, xq, y[chosen], sel.weights)
        codec = make(cfg.compensation, **cfg.compensation_kwargs)
        delta = g_true - g_quant
        compensation = _encode(codec, delta, rng, context, EF_KEY, server_round)

    content, payload_bits = encode_batch(
        samples, y[chosen], chosen, represents, info.num_classes, x.shape[0], compensation
    )
    uploaded[chosen] = True
    _save_state(context, UPLOADED_KEY, server_round, {"mask": mask_before.astype(np.uint8)},
                {"mask": uploaded.astype(np.uint8)})
    content["metrics"] = MetricRecord(
        {
            "num-examples": int(x.shape[0]),
            "partition-id": int(pid),
            "candidates": int(candidates.size),
            "selected": int(chosen.size),
            "up-payload-bits": int(payload_bits),
            "client-time-s": time.perf_counter() - t0,
        }
    )
    return Message(content=content, reply_to=msg)
