"""Decorator registry of codecs: ``@register("name")``, ``make(name, **params)``, ``names()``.

A codec registers when its module is imported; the package (``dq_flower/codecs/__init__.py``)
imports every codec module, so the table is complete before anything can look a name up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from .base import Codec
from .context_coded import CONTEXT, FALLBACK, ContextCoded
from .entropy import check_method
from .lossless import EntropyCoded

__all__ = ["register", "make", "names", "codec_class", "coder_for", "payload_coder"]

_REGISTRY: dict[str, type[Codec]] = {}
C = TypeVar("C", bound=type[Codec])


def register(name: str) -> Callable[[C], C]:
    """Class decorator adding a codec class to the registry under ``name``."""

    def deco(cls: C) -> C:
        if name in _REGISTRY:
            raise ValueError(f"codec {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def codec_class(name: str) -> type[Codec]:
    """Return the codec class registered under ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; known: {', '.join(names())}") from None


def coder_for(codec: Codec | str, coder: str) -> str:
    """The lossless stage ``coder`` gives ``codec``'s payloads: the one place it is chosen.

    ``context`` models integer codes: it stays ``context`` for a codec that says where its
    codes are (:meth:`Codec.symbol_spec`: ``qsgd``, ``terngrad``; ``uniform`` models its
    sample codes itself) and is ``zlib`` for every other codec, whose payloads it would
    zlib-code anyway. Every other coder is itself.
    """
    if coder != CONTEXT:
        return coder
    plain = codec_class(codec)() if isinstance(codec, str) else codec
    return CONTEXT if plain.name == "uniform" or plain.symbol_spec() is not None else FALLBACK


def payload_coder(coder: str) -> str:
    """DQ's coder of its compensations and gradient-round gradients under ``coder``.

    DQ's ``context`` models its sample codes only: these payloads get ``zlib`` under it.
    """
    return FALLBACK if coder == CONTEXT else coder


def make(name: str, **params) -> Codec:
    """Build the codec ``name`` with ``params``; unknown names or bad params raise ValueError.

    ``entropy`` (``none``, ``zlib``, ``lzma``, ``zstd``, ``context``) is accepted by every
    codec: where the codec has no parameter of that name (all but ``uniform``), a coder
    other than ``none`` returns the codec wrapped in
    :class:`~dq_flower.codecs.lossless.EntropyCoded`, whose payloads are entropy-coded
    where that shrinks them (``context`` as :func:`coder_for` resolves it:
    :class:`~dq_flower.codecs.context_coded.ContextCoded` for ``qsgd`` and ``terngrad``,
    ``zlib`` for the other codecs).
    """
    cls = codec_class(name)
    coder = None
    own: set[str] = (
        {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    )
    if "entropy" in params and "entropy" not in own:
        coder = params.pop("entropy")
    try:
        codec = cls(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for codec {name!r}: {exc}") from None
    if coder is None:
        return codec
    coder = coder_for(codec, coder)
    if coder == CONTEXT:
        return ContextCoded(codec)
    if check_method(coder, "entropy") == "none":
        return codec
    return EntropyCoded(codec, coder)


def names() -> list[str]:
    """Sorted names of all registered codecs."""
    return sorted(_REGISTRY)
