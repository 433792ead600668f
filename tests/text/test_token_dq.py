"""Token windows through DQ: the device's text, the reply's checks, the server's store."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from datasets import Dataset
from flwr.app import ArrayRecord, MetricRecord, RecordDict

import dq_flower
from dq_flower.codecs import PayloadError
from dq_flower.codecs import tokens as token_coder
from dq_flower.dq.client.scoring import score_windows
from dq_flower.dq.server.validation import History, Rules, check_upload
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.model_ops import next_token_loss
from dq_flower.text_input import token_windows
from dq_flower.wire.dq_batch import INFO_KEY, SAMPLES_KEY, SPEC_KEY, DataSpec, spec_record
from dq_flower.wire.token_batch import encode_token_batch, tokens_payload
from tests.text import text_app

SPEC = DataSpec((8,), "tokens", 300)
RULES = Rules(bits=2, dither=False, selection_rule="topk", spec=SPEC)


# ------------------------------------------------------------------ the device's text
def test_strings_become_byte_windows_joined_in_order():
    windows, vocab = token_windows(["abcde", "fgh", "ij"], 4)
    assert vocab == 256
    assert windows.tolist() == [list(b"abcd"), list(b"efgh")]  # "ij" is a short remainder


def test_a_tokenizer_and_a_dataset_of_strings():
    tok = text_app.CharTokenizer()
    data = Dataset.from_dict({"text": ["hello world", "again"]})
    windows, vocab = token_windows(data, 4, tokenizer=tok)
    assert vocab == 101
    assert windows.reshape(-1).tolist() == tok.encode("hello worldagain")[:16]
    called = token_windows("xyz!", 2, tokenizer=lambda s: [ord(c) - 32 for c in s], vocab=96)
    assert called[0].tolist() == [[88, 89], [90, 1]]


def test_integer_tokens_need_their_vocabulary_and_ids_inside_it():
    ids = np.arange(20) % 7
    with pytest.raises(ValueError, match="vocab= is needed"):
        token_windows(ids, 5)
    assert token_windows(ids, 5, vocab=7)[0].shape == (4, 5)
    assert token_windows([ids[:12], ids[12:]], 5, vocab=7)[0].shape == (4, 5)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 6\)"):
        token_windows(ids, 5, vocab=6)
    with pytest.raises(ValueError, match="window must be"):
        token_windows(ids, 1, vocab=7)
    with pytest.raises(ValueError, match="windows of 5 tokens; window=4"):
        token_windows(ids.reshape(4, 5), 4, vocab=7)


# ------------------------------------------------------------------ hostile replies
def _content(windows: np.ndarray, vocab: int = 300, ids=None, n_examples: int = 10,
             payload=None) -> RecordDict:
    n = windows.shape[0]
    ids = np.arange(n) if ids is None else ids
    content, _ = encode_token_batch(windows, ids, np.full(n, n_examples / max(n, 1)), vocab,
                                    n_examples)
    if payload is not None:
        content[SAMPLES_KEY] = payload.to_record()
    content[SPEC_KEY] = spec_record(SPEC)
    content["metrics"] = MetricRecord({"num-examples": n_examples, "candidates": n_examples,
                                       "partition-id": 0})
    return content


def _windows(n: int = 3, length: int = 8, top: int = 300) -> np.ndarray:
    return np.random.default_rng(n).integers(0, top, size=(n, length))


def _check(content: RecordDict, max_rows: int = 16):
    return check_upload(content, 0, RULES, History(), max_rows)


def test_an_honest_token_reply_decodes_to_its_windows():
    windows = _windows()
    upload = _check(_content(windows))
    assert np.array_equal(upload.batch.labels, windows)
    assert np.array_equal(upload.x, windows.astype(np.float32))
    assert upload.spec == SPEC and upload.candidates == 10


def _hostile(kind: str) -> RecordDict:
    w = _windows()
    if kind == "id outside the vocabulary":
        bad = w.copy()
        bad[1, 2] = 299
        payload = tokens_payload(bad, 300)
        payload.meta["vocab"] = 280  # same 2-byte width: decodes, then the id is refused
        return _content(w, payload=payload)
    if kind == "wrong window length":
        return _content(w, payload=tokens_payload(_windows(3, 9), 300))
    if kind == "other vocabulary":
        return _content(w, payload=tokens_payload(_windows(3, 8, 200), 256))
    if kind == "more windows than asked":
        return _content(_windows(20), n_examples=40)
    if kind.startswith("huge"):
        payload = tokens_payload(w, 300)
        payload.shape = (1 << 30, 8) if kind == "huge declared shape" else (1 << 27, 8)
        content = _content(w, payload=payload)
        if kind == "huge declared count":  # sample-info agrees: the budget refuses it
            from dq_flower.wire.dq_batch import raw_array

            info = dict(content.array_records[INFO_KEY].items())
            info["counts"] = raw_array(np.array([1 << 27, 0, 4, 1], dtype=np.int64))
            content[INFO_KEY] = ArrayRecord(info)
        return content
    if kind == "corrupt stream":
        payload = tokens_payload(w, 300)
        payload.buffers["stream"] = payload.buffers["stream"][:-4].copy()
        payload.nbits -= 32
        return _content(w, payload=payload)
    content = _content(w)  # labels: windows are their own targets
    info = dict(content.array_records[INFO_KEY].items())
    info["labels"] = info["ids"]
    content[INFO_KEY] = ArrayRecord(info)
    return content


@pytest.mark.parametrize("kind, reason", [
    ("id outside the vocabulary", "token windows of a vocabulary of 280"),
    ("wrong window length", r"shape \(3, 9\), expected \(n, 8\)"),
    ("other vocabulary", "vocabulary of 256; the federation's has 300"),
    ("more windows than asked", "20 token windows exceed the budget of 16"),
    ("huge declared shape", "exceeds 2147483648 elements"),
    ("huge declared count", "134217728 token windows exceed the budget of 16"),
    ("corrupt stream", "token stream"),
    ("labels sent", "no labels travel"),
])
def test_hostile_token_replies_are_rejected_with_a_reason(kind, reason):
    with pytest.raises(PayloadError, match=reason):
        _check(_hostile(kind.replace("labels sent", "labels")))


def test_an_id_outside_the_vocabulary_is_refused_after_decoding():
    from dq_flower.wire.token_batch import decode_windows

    bad = _windows()
    bad[0, 0] = 299
    payload = tokens_payload(bad, 300)
    payload.meta["vocab"] = 280
    with pytest.raises(PayloadError, match="token id 299 is outside the vocabulary of 280"):
        decode_windows(payload, 280, 8, 16)
    big = tokens_payload(_windows(), 300)
    big.shape = (1 << 20, 8)  # within a huge budget: the coder's own bound refuses it
    with pytest.raises(PayloadError, match=f"at most {token_coder.MAX_SYMBOLS} bytes"):
        decode_windows(big, 300, 8, 1 << 21)


# ------------------------------------------------------------------ the server
def _hostile_client(msg, context):
    reply = text_app.train(msg, context)
    if int(context.node_config["partition-id"]) == 2 and SAMPLES_KEY in reply.content:
        samples = reply.content.array_records[SAMPLES_KEY]
        from dq_flower.codecs import Payload

        payload = Payload.from_record(samples)
        payload.meta["vocab"] = 5000  # a vocabulary the federation's model does not have
        reply.content[SAMPLES_KEY] = payload.to_record()
    return reply


def test_the_server_stores_trains_and_checkpoints_token_windows(caplog):
    torch.manual_seed(0)
    model = text_app.CharRNN()
    start = text_app.perplexity(ArrayRecord(model.state_dict()))
    strategy = dq_flower.DQStrategy(model, seed=0, max_server_steps=150, optimizer="adam",
                                    lr=0.01)
    grid = dq_flower.MeasuredGrid(InProcessGrid(_hostile_client, 3))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                                num_rounds=2)
    assert any("token windows of a vocabulary of 5000" in r.getMessage()
               for r in caplog.records)
    honest = [token_windows(text_app.device_text(k), text_app.WINDOW,
                            tokenizer=text_app.CharTokenizer())[0] for k in (0, 1)]
    # the first ask is 200 windows shared by the three nodes (not 10 per vocabulary entry):
    # two rounds store part of the honest nodes' windows; node 2's are refused
    assert 200 // 3 <= strategy.stored < sum(len(w) for w in honest)
    assert strategy.spec == DataSpec((32,), "tokens", 101)
    assert strategy.store.num_train < strategy.stored  # held-out windows
    x, y, _ = strategy.store.draw(20, np.random.default_rng(0))
    assert np.array_equal(x, y.astype(np.float32))  # the windows are their own targets
    # ids, a stratum, a weight (float32: 1/p of a part drawn is not exact in float16), a
    # node, an id and a held-out flag
    per_row = strategy.store.nbytes / strategy.stored
    assert 32 < per_row <= 32 + 8  # 32 one-byte ids: the window is kept once
    rows = {tuple(r) for w in honest for r in w.tolist()}
    assert all(tuple(r) in rows for r in y.tolist())  # stored exactly as the devices hold them
    assert text_app.perplexity(result.arrays) < 0.6 * start  # 100 -> 51 on 118 windows
    resumed = dq_flower.DQStrategy(text_app.CharRNN(), seed=0, max_server_steps=150,
                                   optimizer="adam", lr=0.01)
    resumed.load_state_dict(strategy.state_dict())
    again = resumed.store.draw(20, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(again, (x, y, _), strict=True))


def test_the_next_token_loss_is_the_default_for_windows():
    logits = torch.randn(2, 6, 11, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(1))
    assert torch.equal(dq_flower.model_ops.default_loss(logits, ids),
                       next_token_loss(logits, ids))


def test_the_copy_screen_sees_windows_sent_again_under_new_ids():
    from dq_flower.dq.server.near_copies import CopyScreen
    from dq_flower.dq.server.token_intake import layout_of

    layout = layout_of(DataSpec((8,), "tokens", 300))
    screen = CopyScreen(0.1, bits=2)
    windows = _windows(6)
    first = layout.rows(layout.plain(windows, 300))
    assert not screen.copied(0, first[0], first[1]).any()
    again = np.concatenate([windows[:4], _windows(2, top=299) + 1])  # 4 of 6 sent before
    rows = layout.rows(layout.plain(again, 300))
    assert screen.copied(0, rows[0], rows[1]).tolist() == [True] * 4 + [False] * 2
    decoded = layout.dequantize(*rows)
    assert np.array_equal(decoded, again.astype(np.float32))  # the store's rows are exact


class _Output:
    """An output object with ``logits``, as ``transformers`` models return."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class _IdsOnly(torch.nn.Module):
    """A language model as ``transformers`` has them: int64 ids in, an output object out."""

    def __init__(self, vocab: int = 101, width: int = 16) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.out = torch.nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype != torch.int64:
            raise TypeError(f"token ids must be int64, got {ids.dtype}")
        return _Output(self.out(self.embed(ids)))


def test_a_model_that_reads_only_integer_ids_trains_and_scores(caplog):
    torch.manual_seed(0)
    model = _IdsOnly()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    strategy = dq_flower.DQStrategy(model, seed=0, max_server_steps=20, optimizer="adam",
                                    lr=0.01)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = strategy.start(grid=InProcessGrid(text_app.train, 3),
                                initial_arrays=ArrayRecord(model.state_dict()), num_rounds=1)
    assert not [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert strategy.stored > 0
    x, y, _ = strategy.store.draw(20, np.random.default_rng(0))
    trained = _IdsOnly()
    trained.load_state_dict(result.arrays.to_torch_state_dict())
    before = _IdsOnly()
    before.load_state_dict(start)
    ids = torch.as_tensor(y)
    with torch.no_grad():  # the server's steps lowered the loss on the stored windows
        assert (next_token_loss(trained(ids).logits, ids).mean()
                < next_token_loss(before(ids).logits, ids).mean() - 0.1)
    # a device scores its windows by the same model
    scores = score_windows("entropy", trained, y[:5])
    assert scores.shape == (5,) and np.isfinite(scores).all()


def test_a_model_output_without_logits_is_named():
    assert torch.equal(dq_flower.model_ops.model_output(_Output(torch.ones(2))), torch.ones(2))
    assert torch.equal(dq_flower.model_ops.model_output({"logits": torch.ones(2)}), torch.ones(2))
    with pytest.raises(TypeError, match="the model returned set"):
        dq_flower.model_ops.model_output({torch.ones(2)})
