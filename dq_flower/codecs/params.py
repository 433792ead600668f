"""A codec's parameters as a knob's value: a mapping, a run-config table or their text."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["CodecParams", "parse_params"]


def parse_params(text: str) -> dict[str, Any]:
    """Parse ``"levels=4,bucket=512"`` into ``{"levels": 4, "bucket": 512}``."""
    out: dict[str, Any] = {}
    for part in text.split(",") if text.strip() else ():
        name, sep, raw = (s.strip() for s in part.partition("="))
        if not sep or not name:
            raise ValueError(f"expected 'name=value,...', got {text!r}")
        value: Any
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                continue
        else:
            value = {"true": True, "false": False}.get(raw.lower(), raw)
        out[name.replace("-", "_")] = value
    return out


class CodecParams(Mapping[str, Any]):
    """A codec's parameters: an immutable mapping of names to numbers, booleans or text.

    Built from a mapping (``{"levels": 4, "bucket": 512}``), from a run config's table of
    them (``codec-params.levels = 4``, gathered by :func:`read`), from its text spelling
    ``"levels=4,bucket=512"``, or from nothing (``None``, ``""``). ``str()`` is the text
    spelling, which a ``ConfigRecord`` carries to the clients.
    """

    __slots__ = ("_params",)

    def __init__(self, params: Mapping[str, Any] | str | None = None) -> None:
        if params is None or isinstance(params, str):
            self._params = parse_params(params or "")
            return
        if not isinstance(params, Mapping):
            raise ValueError(f"expected a mapping or 'name=value,...' text, got {params!r}")
        for name, value in params.items():
            if not isinstance(name, str) or not isinstance(value, (bool, int, float, str)):
                raise ValueError(f"parameter {name!r}: expected a number, a boolean or text, "
                                 f"got {value!r}")
        self._params = {name.replace("-", "_"): value for name, value in params.items()}

    def __getitem__(self, name: str) -> Any:
        return self._params[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def __hash__(self) -> int:
        return hash(frozenset(self._params.items()))

    def __str__(self) -> str:
        return ",".join(f"{name}={value}" for name, value in self._params.items())

    def __repr__(self) -> str:
        return repr(self._params)
