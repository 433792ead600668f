"""Client side of the compressed-gradient baselines: gradient (or tau local steps), encode, reply.

The model arrives as a float32 or fp16 payload or, under majority vote with
``downlink="sign"``, as the 1-bit votes to apply to the copy kept in ``Context.state``
(with error feedback, codec and Signum state under ``grad-*``, snapshotted per round).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Message, MetricRecord, RecordDict

from dq_flower.baselines.config import GradientConfig
from dq_flower.client_state import begin_round, end_round, load_state_dict, save_state_dict
from dq_flower.codecs import Payload, PayloadError
from dq_flower.config import read
from dq_flower.data_input import Keys, as_arrays
from dq_flower.losses import binary_loss
from dq_flower.model_ops import (
    LossFn,
    float_buffers,
    get_flat,
    num_params,
    output_width,
    set_flat,
    set_float_buffers,
    weighted_loss_grad,
)
from dq_flower.node import node_key
from dq_flower.seeding import Purpose, round_rng
from dq_flower.update_coding import encode_update
from dq_flower.wire.gradient import (
    METRICS_KEY,
    VOTE_PREFIX,
    model_crc,
    sign_step,
    trainable_mask,
    vote_from_payload,
)
from dq_flower.wire.model import MODEL_KEY, decode_model_payload
from dq_flower.wire.model_buffers import BUFFERS_KEY, buffers_record, read_buffers
from dq_flower.wire.partition import names_partition
from dq_flower.wire.targets import binary_targets, model_targets

__all__ = ["gradient_train", "batch_indices", "epoch_batches", "local_update", "EF_KEY"]

EF_KEY = "grad-ef"
MOMENTUM_KEY = "grad-momentum"
MODEL_STATE_KEY = "grad-model"
#: Most votes a client applies from one message.
MAX_VOTES = 64


def batch_indices(seed: int, server_round: int, partition_id: int, n: int, batch_size: int,
                  steps: int = 1) -> list[np.ndarray]:
    """Per local step, ``min(batch_size, n)`` sorted distinct rows (``Purpose.BATCH``)."""
    rng = round_rng(seed, server_round, partition_id, Purpose.BATCH)
    size = min(int(batch_size), int(n))
    return [np.sort(rng.choice(int(n), size=size, replace=False)) for _ in range(int(steps))]


def epoch_batches(seed: int, server_round: int, partition_id: int, n: int, batch_size: int,
                  epochs: int) -> list[np.ndarray]:
    """Minibatches of ``epochs`` ``Purpose.SHUFFLE`` permutations, as FedAvg's client's."""
    rng = round_rng(seed, server_round, partition_id, Purpose.SHUFFLE)
    out: list[np.ndarray] = []
    for _ in range(int(epochs)):
        order = rng.permutation(int(n))
        out.extend(order[i:i + int(batch_size)] for i in range(0, int(n), int(batch_size)))
    return out


def local_update(
    model, x: np.ndarray, y: np.ndarray, batches: list[np.ndarray], client_lr: float,
    loss_fn: LossFn | None = None, force_steps: bool = False,
) -> tuple[np.ndarray, float, int]:
    """``(update, mean loss, rows used)``: one batch's gradient, or a pseudo-gradient.

    ``(w_0 - w_tau) / (client_lr * tau)`` after tau SGD steps (also one: ``force_steps``).
    """
    def grad_at(idx: np.ndarray) -> tuple[float, np.ndarray]:
        return weighted_loss_grad(model, x[idx], y[idx], np.full(idx.size, 1.0 / idx.size),
                                  loss_fn)
    if len(batches) == 1 and not force_steps:
        loss, grad = grad_at(batches[0])
        return grad, float(loss), int(batches[0].size)
    w0 = get_flat(model)
    w = w0.copy()
    lr = np.float32(client_lr)
    losses = []
    for idx in batches:
        loss, grad = grad_at(idx)
        losses.append(loss)
        w -= lr * grad
        set_flat(model, w)
    update = ((w0 - w) / np.float32(client_lr * len(batches))).astype(np.float32)
    return update, float(np.mean(losses)), int(sum(b.size for b in batches))


#: Prefix of every ``Context.state`` entry of the gradient baselines.
STATE_PREFIX = "grad-"


# ---------------------------------------------------------------- the model this round
def _receive_model(msg: Message, context: Context, cfg: GradientConfig, config: dict,
                   model: torch.nn.Module) -> np.ndarray:
    """The float32 parameters the server wants this round's update computed at."""
    content, dim = msg.content, num_params(model)
    if MODEL_KEY in content.array_records:
        payload = Payload.from_record(content.array_records[MODEL_KEY])
        # size checked against this model before anything is decompressed or decoded
        w = decode_model_payload(payload, dim, cfg.entropy_coder).astype(np.float32)
    else:
        state = load_state_dict(context, MODEL_STATE_KEY)
        base = int(config["base-version"])
        if state is None or int(state.get("version", -1)) != base:
            raise ValueError(f"no local model at version {base} to apply the votes to")
        w = np.asarray(state["w"], dtype=np.float32).copy()
        target = int(config["model-version"])
        if not 0 <= target - base <= MAX_VOTES:
            raise PayloadError(f"{target - base} votes to apply; at most {MAX_VOTES} accepted")
        trainable = trainable_mask(model)  # frozen coordinates keep their values
        for version in range(base + 1, target + 1):
            rec = content.array_records.get(f"{VOTE_PREFIX}{version}")
            if rec is None:
                raise PayloadError(f"vote {version} is missing")
            payload = Payload.from_record(rec)
            if payload.codec != "sign":
                raise PayloadError(f"vote encoded by {payload.codec!r}, expected 'sign'")
            vote = vote_from_payload(payload)
            if vote.size != dim:
                raise PayloadError(f"vote has {vote.size} coordinates, model has {dim}")
            w = sign_step(w, vote, cfg.lr, cfg.weight_decay, trainable)
    if w.size != dim:
        raise PayloadError(f"model has {w.size} parameters, expected {dim}")
    if "model-crc" in config and model_crc(w) != int(config["model-crc"]):
        raise ValueError("local model copy differs from the server's (CRC mismatch)")
    if cfg.downlink_mode == "sign":
        save_state_dict(context, MODEL_STATE_KEY,
                        {"w": w, "version": int(config["model-version"])})
    return w


@names_partition
def gradient_train(msg: Message, context: Context, data: Any, *, model: torch.nn.Module,
                   loss_fn: LossFn | None = None,
                   keys: Keys | None = None) -> Message:
    """Answer one round of a :class:`dq_flower.GradientStrategy` with a coded update.

    Parameters
    ----------
    msg : Message
        The train message (round config and the model, or the votes the client lacks).
    context : Context
        The node's context; its ``state`` keeps error feedback and codec state; its
        ``partition-id`` ends the message of any error raised here.
    data : tuple, Dataset or DataLoader
        The device's own training data (see :mod:`dq_flower.data_input`), used as given.
    model : torch.nn.Module
        The same architecture as the server's; its weights are overwritten.
    loss_fn : callable, optional
        ``loss_fn(outputs, targets)`` returning per-sample losses (default: cross-entropy
        for integer labels, mean squared error for float targets).
    keys : tuple, optional
        ``(input key, target key)`` of dict samples (``("img", "label")``), or ``(input
        keys, target key)`` for columns of one number each (``(["age", "bmi"], "label")``);
        by default found from common names (see :mod:`dq_flower.data_input`).
    """
    if not isinstance(model, torch.nn.Module):
        raise ValueError("gradient_train needs model= (your nn.Module, the server's "
                         "architecture)")
    t0 = time.process_time()
    if "config" not in msg.content.config_records:
        raise ValueError("the train message carries no 'config' record")
    config: dict[str, Any] = dict(msg.content.config_records["config"].items())
    cfg = read(GradientConfig, config)
    server_round = int(config["server-round"])
    seed = int(config.get("run-seed", 0))
    pid = node_key(context)
    x, y = as_arrays(data, keys)
    if x.shape[0] == 0:
        raise ValueError("this node has no training data")
    y = model_targets(y, output_width(model) or 0)  # e.g. a CSV's labels read as floats
    if loss_fn is None and binary_targets(y):  # 0/1 float targets: the model gives logits
        loss_fn = binary_loss
    begin_round(context, server_round, STATE_PREFIX)

    set_flat(model, _receive_model(msg, context, cfg, config, model))
    buffers = float_buffers(model)
    if buffers:  # BatchNorm statistics: the server's, and ours back after the round
        record = msg.content.array_records.get(BUFFERS_KEY)
        if record is None:
            raise PayloadError(f"the train message carries no {BUFFERS_KEY!r} record for this "
                               "model's BatchNorm statistics")
        set_float_buffers(model, read_buffers(record, {k: v.shape for k, v in buffers.items()},
                                              buffers))

    if cfg.epochs_mode:
        batches = epoch_batches(seed, server_round, pid, x.shape[0], cfg.batch_size, cfg.epochs)
    else:
        batches = batch_indices(seed, server_round, pid, x.shape[0], cfg.batch_size,
                                cfg.local_steps)
    update, loss, examples = local_update(model, x, y, batches, cfg.client_lr, loss_fn,
                                          force_steps=cfg.epochs_mode)
    if cfg.majority and cfg.momentum > 0:  # Signum: client momentum m = momentum * m + update
        state = load_state_dict(context, MOMENTUM_KEY)
        m = update if state is None else np.float32(cfg.momentum) * state["m"] + update
        update = np.asarray(m, dtype=np.float32)
        save_state_dict(context, MOMENTUM_KEY, {"m": update})

    shapes = [tuple(p.shape) for p in model.parameters()]
    rng = round_rng(seed, server_round, pid, Purpose.CODEC)
    records, nbits = encode_update(update, shapes, cfg, context, rng, STATE_PREFIX)
    content = RecordDict({METRICS_KEY: MetricRecord({
        "num-examples": int(examples),
        "train-loss": float(loss),
        "partition-id": int(pid),
        "up-payload-bits": nbits,
        "client-time-s": time.process_time() - t0,
    }), **records})
    if buffers:
        content[BUFFERS_KEY] = buffers_record(float_buffers(model))
    end_round(context, server_round, STATE_PREFIX)
    return Message(content=content, reply_to=msg)
