"""The codec-choice knobs that the gradient baselines and ``CompressedUpdates`` share.

:class:`CodecChoice` is a knob group: ``GradientConfig`` and ``CompressionConfig`` inherit
its knobs flat (``codec``, ``codec-params``, ``levels``, ...). A strategy builds its codec
from it once (:meth:`CodecChoice.make_codec`); the clients build theirs from the same knobs
in each train message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dq_flower.codecs import CONTEXT, Codec, coder_for, make
from dq_flower.codecs.entropy import available
from dq_flower.codecs.params import CodecParams
from dq_flower.codecs.uniform import SAMPLE_CODERS
from dq_flower.config import knob, one_of

__all__ = ["CodecChoice", "CODEC_DEFAULTS", "ENTROPY_CODERS", "ERROR_FEEDBACK", "PER_TENSOR"]

#: When the clients wrap the codec in error feedback (``auto``: where the codec is biased
#: and the aggregation is the mean).
ERROR_FEEDBACK = ("auto", "on", "off")
#: Whether each parameter tensor is coded on its own (``auto``: for PowerSGD, which needs
#: the layers' matrix shapes, and TernGrad, whose scale is per tensor).
PER_TENSOR = ("auto", "on", "off")
PER_TENSOR_CODECS = ("powersgd", "terngrad")
#: Codec parameters where they differ from the codec's own defaults; ``codec-params`` and
#: the ``levels``/``bucket``/``ratio``/``rank`` knobs override them.
CODEC_DEFAULTS: dict[str, dict[str, Any]] = {
    "qsgd": {"levels": 4, "bucket": 512},
    "orq": {"levels": 3, "bucket": 512},
    "bingrad": {"bucket": 512},
    "topk": {"ratio": 0.01},
    "powersgd": {"rank": 2},
}
#: Lossless coders of every payload (``entropy-coder``); ``zstd`` needs ``zstandard``.
#: ``context`` (DQ's default, a model of quantized sample codes) is accepted so that one run
#: config serves every method; the registry's ``coder_for`` resolves it per codec.
ENTROPY_CODERS = SAMPLE_CODERS
#: Codec parameters that are also knobs of their own (``None``: not set; spelled 0).
CODEC_PARAM_KNOBS = ("levels", "bucket", "ratio", "rank")


def _off_or_positive(value: Any) -> str | None:
    return None if value >= 1 else f"must be >= 1 (None or 0 = not set), got {value}"


def _coder_here(value: Any) -> str | None:
    if value not in ENTROPY_CODERS:
        return f"must be one of {ENTROPY_CODERS}, got {value!r}"
    if value not in (*available(), CONTEXT):
        return f"{value!r} needs the optional 'zstandard' package: pip install zstandard"
    return None


@dataclass(frozen=True)
class CodecChoice:
    """Knobs choosing the codec of a client's update, checked together as it is built."""

    codec: str = knob("identity", client=True, doc=(
        "registry codec of the uploads (each method sets its own)"))
    codec_params: CodecParams = knob(CodecParams(), client=True, unset="", coerce=CodecParams,
                                     doc=(
        "codec parameters (`codec-params.levels = 4`, or the text `\"levels=4,bucket=512\"`; "
        "in Python a dict), layered over the baseline defaults (`qsgd` levels 4 bucket 512, "
        "`orq` levels 3 bucket 512, `bingrad` bucket 512, `topk` ratio 0.01, `powersgd` "
        "rank 2)"))
    levels: int | None = knob(None, _off_or_positive, client=True, unset=0, doc=(
        "shortcut overriding the codec parameter `levels`"))
    bucket: int | None = knob(None, _off_or_positive, client=True, unset=0, doc=(
        "shortcut overriding the codec parameter `bucket`"))
    ratio: float | None = knob(None, lambda v: None if 0 < v <= 1 else (
        f"must be in (0, 1] (None or 0 = not set), got {v}"), client=True, unset=0.0,
        doc="top-k's kept fraction")
    rank: int | None = knob(None, _off_or_positive, client=True, unset=0, doc=(
        "shortcut overriding PowerSGD's `rank`"))
    error_feedback: str = knob("auto", one_of(ERROR_FEEDBACK), client=True, unset="auto",
                               doc="`on`, `off`; `auto` = on for biased codecs under mean "
                                   "aggregation")
    per_tensor: str = knob("auto", one_of(PER_TENSOR), client=True, unset="auto", doc=(
        "`on`, `off`; `auto` = on for `powersgd` and `terngrad`"))
    entropy_coder: str = knob("zlib", _coder_here, client=True, doc=(
        "lossless stage of every upload and of the model broadcast: `none`, `zlib`, `lzma`, "
        "`zstd` (with `pip install zstandard`), `context` (the codes "
        "of `qsgd` and `terngrad` modelled, `zlib` for the other codecs and the broadcast); "
        "per message only where it shrinks it"))

    def __post_init__(self) -> None:
        """The codec, its parameters and the coder, checked together."""
        try:
            self.make_codec()
        except ValueError as exc:
            key = "codec" if "unknown codec" in str(exc) else "codec-params"
            raise ValueError(f"{key}: {exc}") from None

    @property
    def majority(self) -> bool:
        """Whether the server aggregates by majority vote (never, but for ``GradientConfig``)."""
        return False

    @property
    def segmented(self) -> bool:
        """Whether the update is coded per parameter tensor (``per_tensor`` resolved)."""
        if self.per_tensor == "auto":
            return self.codec in PER_TENSOR_CODECS
        return self.per_tensor == "on"

    @property
    def coder(self) -> str:
        """``entropy_coder`` as the registry resolves it for ``codec``."""
        return coder_for(self.codec, self.entropy_coder)

    @property
    def entropy(self) -> str:
        """The uploads' lossless coder: ``entropy`` of ``codec_params``, else ``entropy_coder``."""
        return str(self.codec_kwargs.get("entropy", self.entropy_coder))

    def make_codec(self) -> Codec:
        """The upload codec: the registry codec, entropy-coded with :attr:`entropy`."""
        return make(self.codec, **{**self.codec_kwargs, "entropy": self.entropy})

    @property
    def codec_kwargs(self) -> dict[str, Any]:
        """The codec's parameters: defaults, then ``codec_params``, then the shortcut knobs."""
        params = {**CODEC_DEFAULTS.get(self.codec, {}), **self.codec_params}
        params.update((name, value) for name in CODEC_PARAM_KNOBS
                      if (value := getattr(self, name)) is not None)
        return params
