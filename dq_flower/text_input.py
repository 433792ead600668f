"""A device's text as DQ's token samples: fixed-length windows of token ids.

``data`` may be a string, a sequence of strings, a data set of strings or of dicts with a
``text`` column (a Hugging Face ``datasets.Dataset``), a 1-D integer array (one token
sequence), a sequence of them, or a 2-D integer array of windows already cut. Strings are
tokenized by the app's ``tokenizer`` (a callable ``str -> ids``, or an object with
``encode``, as Hugging Face tokenizers are), by default as their UTF-8 bytes (a vocabulary
of 256). The sequences are joined in order and cut into consecutive windows of ``window``
tokens; a last part shorter than a window is left out. Ids must lie in ``[0, vocab)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = ["BYTE_VOCAB", "TEXT_KEYS", "token_windows", "vocab_of"]

#: The vocabulary of the default tokenizer (UTF-8 bytes).
BYTE_VOCAB = 256
#: Names of a dict sample's text, in order of preference.
TEXT_KEYS = ("text", "content", "sentence", "document")


def vocab_of(tokenizer: Any) -> int | None:
    """A tokenizer's vocabulary size; ``None`` where it has no ``len`` or ``vocab_size``.

    No tokenizer (UTF-8 bytes): 256. ``len`` counts added tokens, as Hugging Face's does.
    """
    if tokenizer is None:
        return BYTE_VOCAB
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else getattr(tokenizer,
                                                                         "vocab_size", None)
    return int(size) if isinstance(size, int) and not isinstance(size, bool) else None


def _encoder(tokenizer: Any) -> Callable[[str], Any]:
    if tokenizer is None:
        return lambda s: np.frombuffer(s.encode("utf-8"), dtype=np.uint8)
    if hasattr(tokenizer, "encode"):
        return tokenizer.encode
    if callable(tokenizer):
        return tokenizer
    raise ValueError(f"tokenizer must be callable or have .encode, got {type(tokenizer)}")


def _text(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    if isinstance(item, Mapping):
        key = next((k for k in TEXT_KEYS if k in item), None)
        return item[key] if key is not None and isinstance(item[key], str) else None
    return None


def _sequences(data: Any, tokenizer: Any) -> list[np.ndarray] | np.ndarray:
    """The token sequences of ``data`` (a 2-D integer array stays one array of windows)."""
    if isinstance(data, str):
        data = [data]
    column = getattr(data, "column_names", None)  # a datasets.Dataset: read its text column
    if column is not None:
        key = next((k for k in TEXT_KEYS if k in column), None)
        if key is None:
            raise ValueError(f"the data set has no text column (looked for {TEXT_KEYS}; "
                             f"it has {list(column)})")
        data = data[key]
    if isinstance(data, np.ndarray) and data.dtype.kind in "iu":
        return data if data.ndim == 2 else [data.reshape(-1)]
    encode = _encoder(tokenizer)
    out = []
    for k, item in enumerate(data):
        text = _text(item)
        if text is not None:
            out.append(np.asarray(encode(text)))
            continue
        ids = np.asarray(item)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(f"text item {k}: expected a string or a 1-D integer sequence, "
                             f"got {type(item).__name__}")
        out.append(ids)
    return out


def token_windows(data: Any, window: int, vocab: int | None = None,
                  tokenizer: Any = None) -> tuple[np.ndarray, int]:
    """``(windows, vocab)``: int64 ``(n, window)`` windows of ``data`` and the vocabulary.

    ``vocab`` defaults to the tokenizer's (256 for the UTF-8 default); integer data with no
    tokenizer needs it. ``ValueError`` names a bad window, vocabulary or id.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ValueError(f"window must be an int >= 2 (tokens per sample), got {window!r}")
    if vocab is None:
        if tokenizer is None and _integer_input(data):
            raise ValueError("vocab= is needed for integer token data (the vocabulary size "
                             "of the model's tokenizer)")
        vocab = vocab_of(tokenizer)
        if vocab is None:
            raise ValueError("the tokenizer has no len() or vocab_size: pass vocab=")
    seqs = _sequences(data, tokenizer)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or not 2 <= vocab <= 1 << 16:
        raise ValueError(f"vocab must be an int in 2..65536, got {vocab!r}")
    if isinstance(seqs, np.ndarray):
        if seqs.shape[1] != window:
            raise ValueError(f"windows of {seqs.shape[1]} tokens; window={window}")
        windows = seqs.astype(np.int64)
    else:
        flat = (np.concatenate([s.astype(np.int64).reshape(-1) for s in seqs])
                if seqs else np.zeros(0, np.int64))
        windows = flat[:flat.size // window * window].reshape(-1, window)
    if windows.size and (int(windows.min()) < 0 or int(windows.max()) >= vocab):
        raise ValueError(f"token ids must be in [0, {vocab}), got {int(windows.min())}.."
                         f"{int(windows.max())}")
    return np.ascontiguousarray(windows), int(vocab)


def _integer_input(data: Any) -> bool:
    """Whether ``data`` is integer ids rather than strings."""
    if isinstance(data, np.ndarray):
        return data.dtype.kind in "iu"
    if isinstance(data, str) or getattr(data, "column_names", None) is not None:
        return False
    return any(_text(item) is None for item in data)  # a sequence: any non-text item
