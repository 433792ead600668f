"""Client side of data quantization: select, quantize, compensate, reply.

State kept across rounds in ``Context.state``:
- ``dq-uploaded``: a mask of the local samples already uploaded (not sent again unless
  ``resend``);
- ``dq-ef``: the error-feedback residual of a biased compensation codec.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord

from ..codecs import make
from ..config import DQConfig, TaskConfig, from_mapping
from ..dq_wire import encode_batch
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
    xt = torch.as_tensor(x, dtype=torch.float32)
    yt = torch.as_tensor(y, dtype=torch.long)
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
    return torch.cat(scores).double().numpy()


def _uploaded_mask(context: Context, n: int) -> np.ndarray:
    rec = context.state.array_records.get(UPLOADED_KEY)
    if rec is None or "mask" not in rec:
        return np.zeros(n, dtype=bool)
    mask = np.frombuffer(rec["mask"].data, dtype=np.uint8).astype(bool)
    return mask if mask.size == n else np.zeros(n, dtype=bool)


def _save_mask(context: Context, mask: np.ndarray) -> None:
    data = mask.astype(np.uint8)
    context.state[UPLOADED_KEY] = ArrayRecord(
        {"mask": Array(dtype="uint8", shape=(data.size,), stype="raw", data=data.tobytes())}
    )


def _error_feedback(context: Context, codec):
    from ..codecs import ErrorFeedback

    ef = ErrorFeedback(codec)
    rec = context.state.array_records.get(EF_KEY)
    if rec is not None and "residual" in rec:
        ef.load_state_dict({"residual": np.frombuffer(rec["residual"].data, dtype=np.float32)})
    return ef


def _save_error_feedback(context: Context, ef) -> None:
    res = ef.state_dict().get("residual")
    if res is not None:
        res = np.ascontiguousarray(res, dtype=np.float32).reshape(-1)
        context.state[EF_KEY] = ArrayRecord(
            {"residual": Array(dtype="float32", shape=(res.size,), stype="raw",
                               data=res.tobytes())}
        )


def train(msg: Message, context: Context) -> Message:
    """Handle one DQ round: upload quantized samples (and a compensation) for this node."""
    t0 = time.perf_counter()
    config = dict(msg.content["config"].items())
    task = from_mapping(TaskConfig, config)
    cfg = from_mapping(DQConfig, config)
    server_round = int(config["server-round"])
    round_seed = int(config.get("round-seed", task.seed))
    pid, _ = node_partition(context, task)
    info = task_info(task)
    x, y = client_data(context, task)
    rng = round_rng(round_seed, server_round, pid)

    uploaded = _uploaded_mask(context, x.shape[0])
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
        if codec.biased:
            ef = _error_feedback(context, codec)
            compensation = ef.encode(delta, rng)
            _save_error_feedback(context, ef)
        else:
            compensation = codec.encode(delta, rng)

    content, payload_bits = encode_batch(
        samples, y[chosen], chosen, represents, info.num_classes, x.shape[0], compensation
    )
    uploaded[chosen] = True
    _save_mask(context, uploaded)
    content["metrics"] = MetricRecord(
        {
            "num-examples": int(x.shape[0]),
            "candidates": int(candidates.size),
            "selected": int(chosen.size),
            "up-payload-bits": int(payload_bits),
            "client-time-s": time.perf_counter() - t0,
        }
    )
    return Message(content=content, reply_to=msg)
