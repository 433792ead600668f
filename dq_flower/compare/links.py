"""Time on links: what each round would take on a given network, from measured quantities.

Nothing sleeps and nothing is throttled. Per round, with the history row's measured
``clients`` (``[compute_s, down_bytes, up_bytes]`` per replying client) and
``server_compute_s``::

    T_round = server_compute_s + rtt + max_k (compute_k + 8 down_k / down_bps + 8 up_k / up_bps)

the slowest sampled client's critical path (its compute, its downlink and uplink bytes over
the link), one round trip of latency, and the server's compute. A round in which no client
replied (a DQ round that trains on its store) costs the server's compute alone. Round 0 (the
initial model) costs nothing. Rows without ``clients`` (results written before the timing
fields existed) give no time.

A profile is ``name=down/up/latency`` (``lte=10mbit/1mbit/50ms``); rates take ``bit``,
``kbit``, ``mbit``, ``gbit`` (also ``bps``, ``kbps``, ``mbps``, ``gbps``; decimal
prefixes), the latency ``s``, ``ms`` or ``us`` and is the round-trip time, paid once per
round.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "LinkProfile",
    "BUILTIN_LINKS",
    "DEFAULT_LINKS",
    "parse_link",
    "parse_links",
    "round_time",
    "cumulative_times",
    "time_to_target",
]


@dataclass(frozen=True)
class LinkProfile:
    """A network link every client has to the server.

    Attributes
    ----------
    name : str
        Profile name (``lte``, ``wifi``, ``datacenter`` or the user's).
    down_bps, up_bps : float
        Downlink (server to client) and uplink rates, bits per second.
    rtt_s : float
        Round-trip latency, seconds, paid once per round.
    """

    name: str
    down_bps: float
    up_bps: float
    rtt_s: float

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", self.name):
            raise ValueError(f"link name must be 1 to 32 letters, digits, '_', '.', '-'; "
                             f"got {self.name!r}")
        for key in ("down_bps", "up_bps"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ValueError(f"link {self.name}: {key} must be a positive rate, "
                                 f"got {value!r}")
        if not (isinstance(self.rtt_s, (int, float)) and 0 <= self.rtt_s < float("inf")):
            raise ValueError(f"link {self.name}: rtt_s must be >= 0, got {self.rtt_s!r}")

    def describe(self) -> str:
        """``lte (10 Mbit/s down, 1 Mbit/s up, 50 ms round trip)``."""
        return (f"{self.name} ({_rate(self.down_bps)} down, {_rate(self.up_bps)} up, "
                f"{_latency(self.rtt_s)} round trip)")

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (the fields)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LinkProfile:
        """Inverse of :meth:`to_json`."""
        return cls(str(data["name"]), float(data["down_bps"]), float(data["up_bps"]),
                   float(data["rtt_s"]))


#: The built-in profiles: a mobile uplink, a home Wi-Fi, a data-centre network.
BUILTIN_LINKS: dict[str, LinkProfile] = {
    "lte": LinkProfile("lte", 10e6, 1e6, 0.050),
    "wifi": LinkProfile("wifi", 50e6, 20e6, 0.010),
    "datacenter": LinkProfile("datacenter", 10e9, 10e9, 0.0001),
}
#: Profiles a comparison reports when none are given.
DEFAULT_LINKS = ("lte", "wifi", "datacenter")

_RATE_UNITS = {"bit": 1.0, "bps": 1.0, "kbit": 1e3, "kbps": 1e3, "mbit": 1e6, "mbps": 1e6,
               "gbit": 1e9, "gbps": 1e9}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"


def _quantity(text: str, units: Mapping[str, float], what: str) -> float:
    m = re.fullmatch(rf"\s*({_NUMBER})\s*([a-z/]*)\s*", text.lower())
    unit = m.group(3) if m else ""
    if m is None or unit not in units:
        raise ValueError(f"{what} {text!r}: expected a number with a unit "
                         f"({', '.join(units)})")
    return float(m.group(1)) * units[unit]


def parse_link(text: str) -> LinkProfile:
    """A profile from ``name`` (built-in) or ``name=down/up/latency``.

    Raises
    ------
    ValueError
        An unknown built-in name, or a malformed or non-positive rate or latency.
    """
    name, sep, spec = text.strip().partition("=")
    name = name.strip()
    if not sep:
        if name in BUILTIN_LINKS:
            return BUILTIN_LINKS[name]
        raise ValueError(f"unknown link {name!r}; built-in: {', '.join(BUILTIN_LINKS)}, or "
                         "give name=down/up/latency, e.g. sat=20mbit/2mbit/600ms")
    parts = spec.split("/")
    if len(parts) != 3:
        raise ValueError(f"link {text!r}: expected name=down/up/latency, e.g. "
                         "lte=10mbit/1mbit/50ms")
    down = _quantity(parts[0], _RATE_UNITS, f"link {name}: downlink rate")
    up = _quantity(parts[1], _RATE_UNITS, f"link {name}: uplink rate")
    rtt = _quantity(parts[2], _TIME_UNITS, f"link {name}: latency")
    return LinkProfile(name, down, up, rtt)


def parse_links(texts: Sequence[str]) -> list[LinkProfile]:
    """Profiles from several specs (default :data:`DEFAULT_LINKS`); names must be unique."""
    links = [parse_link(t) for t in (texts or DEFAULT_LINKS)]
    names = [link.name for link in links]
    if len(set(names)) != len(names):
        raise ValueError(f"link names must be unique, got {', '.join(names)}")
    return links


def round_time(row: Mapping[str, Any], link: LinkProfile) -> float | None:
    """Simulated seconds of one round on ``link`` (``None`` without timing fields)."""
    if int(row.get("round", 0)) == 0:
        return 0.0
    clients = row.get("clients")
    if clients is None:
        return None
    server = float(row.get("server_compute_s") or 0.0)
    if not clients:
        return server
    slowest = max(float(c) + 8.0 * float(d) / link.down_bps + 8.0 * float(u) / link.up_bps
                  for c, d, u in clients)
    return server + link.rtt_s + slowest


def cumulative_times(history: Iterable[Mapping[str, Any]],
                     link: LinkProfile) -> list[float] | None:
    """Simulated seconds elapsed at the end of every round (round 0: 0), or ``None``."""
    total, out = 0.0, []
    for row in history:
        t = round_time(row, link)
        if t is None:
            return None
        total += t
        out.append(total)
    return out


def time_to_target(history: Sequence[Mapping[str, Any]], link: LinkProfile,
                   target: float) -> float | None:
    """Simulated seconds until the test accuracy first reaches ``target`` (``None``: never)."""
    times = cumulative_times(history, link)
    if times is None:
        return None
    for row, t in zip(history, times, strict=True):
        if float(row["accuracy"]) >= target:
            return t
    return None


def _rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


def _latency(s: float) -> str:
    return f"{s * 1e3:g} ms" if s >= 1e-3 or s == 0 else f"{s * 1e6:g} us"
