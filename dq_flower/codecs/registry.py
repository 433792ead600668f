"""Decorator registry of codecs: ``@register("name")``, ``make(name, **params)``, ``names()``.

A codec registers when its module is imported; the package (``dq_flower/codecs/__init__.py``)
imports every codec module, so the table is complete before anything can look a name up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from .base import Codec
from .context_coded import CONTEXT, ContextCoded
from .entropy import check_method
from .lossless import EntropyCoded

__all__ = ["register", "make", "names", "codec_class"]

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


def make(name: str, **params) -> Codec:
    """Build the codec ``name`` with ``params``; unknown names or bad params raise ValueError.

    ``entropy`` (``none``, ``zlib``, ``lzma``, ``zstd``, ``context``) is accepted by every
    codec: where the codec has no parameter of that name (all but ``uniform``), a coder
    other than ``none`` returns the codec wrapped in
    :class:`~dq_flower.codecs.lossless.EntropyCoded`, whose payloads are entropy-coded
    where that shrinks them (``context``:
    :class:`~dq_flower.codecs.context_coded.ContextCoded`, which models the codes of
    ``qsgd`` and ``terngrad`` and zlib-codes the other codecs' payloads).
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
    if coder == CONTEXT:
        return ContextCoded(codec)
    if check_method(coder, "entropy") == "none":
        return codec
    return EntropyCoded(codec, coder)


def names() -> list[str]:
    """Sorted names of all registered codecs."""
    return sorted(_REGISTRY)
