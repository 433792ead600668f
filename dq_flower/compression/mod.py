"""``compression_mod``: the client mod of :class:`dq_flower.CompressedUpdates`.

Per train message it reads the ``compression-*`` knobs (decoding an fp16 broadcast), calls
``train()``, then replaces the returned ``ArrayRecord`` by the coded update (returned minus
received weights); other messages pass untouched; a failure is an error reply naming it.
Both, and an exception the app's own ``train()`` raises, name the node's ``partition-id``.
"""

from __future__ import annotations

from logging import ERROR, INFO
from typing import Any, cast

from flwr.app import ArrayRecord, Context, Error, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from dq_flower.client_state import begin_round, end_round
from dq_flower.codecs import Payload
from dq_flower.compression.config import MESSAGE_PREFIX, CompressionConfig
from dq_flower.node import node_key
from dq_flower.seeding import Purpose, round_rng
from dq_flower.update_coding import encode_update
from dq_flower.wire import compressed_update as wire
from dq_flower.wire.model import decode_model_payload
from dq_flower.wire.partition import names_partition, partition_tag

__all__ = ["compression_mod", "STATE_PREFIX"]

#: Prefix of the mod's ``Context.state`` entries (error-feedback residuals, codec state).
STATE_PREFIX = "compression-"


def _error(msg: Message, reason: str) -> Message:
    log(ERROR, "compression_mod: %s", reason)
    return Message(Error(code=ErrorCode.MOD_FAILED_PRECONDITION,
                         reason=f"compression_mod: {reason}"), reply_to=msg)


def _config(msg: Message) -> dict[str, Any]:
    """The config record that carries the wrapper's knobs."""
    marker = f"{MESSAGE_PREFIX}codec"
    for record in msg.content.config_records.values():
        if marker in record:
            return dict(record.items())
    raise ValueError(f"the train message has no {marker!r} in its config; is the ServerApp's "
                     "strategy wrapped in dq_flower.CompressedUpdates?")


def _received(msg: Message, config: dict[str, Any]) -> tuple[wire.Layout, ArrayRecord]:
    """The model the user's ``train()`` gets (decoded into the message), and its layout."""
    content = msg.content
    if wire.MODEL_KEY not in content.array_records:
        key = wire.single_array_record(content.array_records, "the train message")
        return wire.Layout.of(key, content.array_records[key]), content.array_records[key]
    layout = wire.Layout.from_json(config.get(wire.LAYOUT_KEY))
    payload = Payload.from_record(content.array_records[wire.MODEL_KEY])
    vec = decode_model_payload(payload, layout.dim)  # size checked before decoding
    record = layout.rebuild(vec, content.array_records.get(wire.RAW_KEY))
    # a new RecordDict: the message's own may be shared with other nodes' messages
    items = {k: v for k, v in content.items() if k not in (wire.MODEL_KEY, wire.RAW_KEY)}
    msg.content = RecordDict({**items, layout.key: record})
    return layout, record


def _code_reply(out: Message, layout: wire.Layout, received: ArrayRecord, cfg: CompressionConfig,
                config: dict[str, Any], context: Context) -> int:
    """Replace the reply's ``ArrayRecord`` by the coded update; return its payload bits."""
    content = out.content
    key = wire.single_array_record(content.array_records, "the reply of train()")
    returned = content.array_records[key]
    layout.check(returned, "the returned arrays")
    if "server-round" not in config:
        raise ValueError("the train message's config has no 'server-round'")
    server_round = int(cast(int, config["server-round"]))
    update = layout.flat(returned) - layout.flat(received)
    rng = round_rng(cfg.seed, server_round, node_key(context), Purpose.MOD_CODEC)
    begin_round(context, server_round, STATE_PREFIX)
    records, nbits = encode_update(update, layout.coded_shapes, cfg, context, rng, STATE_PREFIX,
                                   wire.UPDATE_KEY)
    end_round(context, server_round, STATE_PREFIX)
    raw = layout.raw_record(returned)
    del content[key]
    for name, record in records.items():
        content[name] = record
    if len(raw):
        content[wire.RAW_KEY] = raw
    return nbits


@names_partition
def compression_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """Client mod coding the update that the ``@app.train()`` function returns.

    Use it as ``ClientApp(mods=[dq_flower.compression_mod])`` with
    :class:`dq_flower.CompressedUpdates` in the ServerApp. Only ``MessageType.TRAIN``
    messages are changed; error-feedback state lives in ``ctxt.state``.
    """
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, ctxt)
    try:
        config = _config(msg)
        cfg = CompressionConfig.from_message_config(config)
        layout, received = _received(msg, config)
    except Exception as exc:  # noqa: BLE001  (answered as an error reply)
        return _error(msg, str(exc) + partition_tag(ctxt))
    out = call_next(msg, ctxt)
    if out.has_error():
        return out
    try:
        nbits = _code_reply(out, layout, received, cfg, config, ctxt)
    except Exception as exc:  # noqa: BLE001
        return _error(msg, str(exc) + partition_tag(ctxt))
    log(INFO, "compression_mod: update coded by %s, %d payload bits (float32: %d)",
        cfg.codec, nbits, 32 * layout.dim)
    return out
