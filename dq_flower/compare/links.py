"""Time on links: what each round would take on a given network, from measured quantities.

Per round, from the history row's ``clients`` (``[compute_s, down_bytes, up_bytes]`` per
replying client) and ``server_compute_s``::

    T_round = server_compute_s + rtt + max_k (compute_k + 8 down_k / down_bps + 8 up_k / up_bps)

A round no client replied to costs the server's compute alone, round 0 nothing, a row
without ``clients`` gives no time. A profile is ``name=down/up/latency``
(``lte=10mbit/1mbit/50ms``, decimal prefixes, round-trip latency); a direction with a
payload limit has a :class:`~dq_flower.compare.framing.Framing` instead of ``8 B / rate``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dq_flower.compare.framing import Framing, iridium_sbd_seconds, lorawan_framing

__all__ = ["LinkProfile", "BUILTIN_LINKS", "DEFAULT_LINKS", "parse_link", "parse_links",
           "round_time", "cumulative_times", "time_to_target", "links_of"]


@dataclass(frozen=True)
class LinkProfile:
    """A network link every client has to the server (rates in bit/s, latency in s)."""

    name: str
    down_bps: float
    up_bps: float
    rtt_s: float  # round trip, paid once per round
    down_framing: Framing | None = None  # a payload limit: then it gives the time
    up_framing: Framing | None = None
    source: str = field(default="", compare=False)  # where the figures come from

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
        """``lte (10 Mbit/s down, 1 Mbit/s up, 50 ms round trip)``; framing where it has one."""
        text = (f"{self.name} ({_rate(self.down_bps)} down, {_rate(self.up_bps)} up, "
                f"{_latency(self.rtt_s)} round trip")
        if self.up_framing is not None:
            text += f"; up in {self.up_framing.describe()}"
        if self.down_framing is not None:
            text += f"; down in {self.down_framing.describe()}"
        return text + ")"

    def down_seconds(self, nbytes: float) -> float:
        """Seconds to send ``nbytes`` bytes from the server to a client."""
        if self.down_framing is not None:
            return self.down_framing.seconds(nbytes)
        return 8.0 * float(nbytes) / self.down_bps

    def up_seconds(self, nbytes: float) -> float:
        """Seconds to send ``nbytes`` bytes from a client to the server."""
        if self.up_framing is not None:
            return self.up_framing.seconds(nbytes)
        return 8.0 * float(nbytes) / self.up_bps

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (the fields; the framing and source only where set)."""
        return {k: v for k, v in asdict(self).items()
                if k in ("name", "down_bps", "up_bps", "rtt_s") or v}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LinkProfile:
        """Inverse of :meth:`to_json`."""
        return cls(str(data["name"]), float(data["down_bps"]), float(data["up_bps"]),
                   float(data["rtt_s"]), Framing.from_json(data.get("down_framing")),
                   Framing.from_json(data.get("up_framing")), str(data.get("source", "")))


def _framed(name: str, down: Framing, up: Framing, rtt_s: float, source: str) -> LinkProfile:
    """A link whose two directions have payload limits; its rates are the sustained ones."""
    def rate(f: Framing) -> float:
        return 8.0 * f.payload_bytes / (f.frame_s / f.duty_cycle)
    return LinkProfile(name, rate(down), rate(up), rtt_s, down, up, source)


_LORAWAN_SOURCE = (
    "LoRaWAN EU868 {dr} ({sf}/125 kHz) both ways: at most {payload} application bytes per "
    "frame (LoRaWAN Regional Parameters RP002-1.0.x, EU863-870) plus 13 bytes of MAC "
    "header and MIC (LoRaWAN L2 1.0.4, section 4); airtime from the Semtech SX1276 "
    "datasheet's formula (coding rate 4/5, 8-symbol preamble, explicit header, CRC); 1% "
    "duty cycle of the 868.0-868.6 MHz sub-band of the default channels (ETSI EN 300 "
    "220-2); the downlink in RX1 at the uplink's data rate under the same limit; round trip "
    "1 s (RECEIVE_DELAY1). One gateway per device assumed (no contention); a class A "
    "device's uplink that opens each downlink window is not counted")

#: The built-in profiles: a mobile uplink, a home Wi-Fi, a data-centre network, and the
#: constrained links of IoT deployments (NB-IoT, LoRaWAN, satellite messaging).
BUILTIN_LINKS: dict[str, LinkProfile] = {
    "lte": LinkProfile("lte", 10e6, 1e6, 0.050, source=(
        "a modest mobile link (the package's original choice, not a measurement)")),
    "wifi": LinkProfile("wifi", 50e6, 20e6, 0.010, source=(
        "a home Wi-Fi behind a broadband line (the package's original choice)")),
    "datacenter": LinkProfile("datacenter", 10e9, 10e9, 0.0001, source=(
        "a 10 Gbit/s data-centre network (the package's original choice)")),
    "nbiot": LinkProfile("nbiot", 26e3, 62e3, 1.6, source=(
        "NB-IoT Cat-NB1 (3GPP Release 13): peak 26 kbit/s down and 62 kbit/s up "
        "(multi-tone), latency 1.6 to 10 s (the low end taken); sustained rates can be "
        "several times lower (Anritsu, 'Determining Peak Data Rates for NB-IoT'); IP "
        "segmentation below the application, no payload limit modelled")),
    "lorawan": _framed("lorawan", lorawan_framing(5, 0.01), lorawan_framing(5, 0.01), 1.0,
                       _LORAWAN_SOURCE.format(dr="DR5", sf="SF7", payload=222)),
    "lorawan-sf12": _framed("lorawan-sf12", lorawan_framing(0, 0.01),
                            lorawan_framing(0, 0.01), 1.0,
                            _LORAWAN_SOURCE.format(dr="DR0", sf="SF12", payload=51)),
    "iridium": _framed(
        "iridium", Framing(270, iridium_sbd_seconds(270)), Framing(340, iridium_sbd_seconds(340)),
        0.0, "Iridium Short Burst Data (satellite messaging, 9602/9603 transceivers): "
             "messages of at most 340 bytes from the device and 270 bytes to it, sent one "
             "after another; each takes the delivery latency of a line through Iridium's "
             "figures, about 5 s for a short message and 20 s for a 1960-byte one (NAL "
             "Research, 'Short Burst Data'); the latency is per message, so no round trip "
             "is added"),
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
    """A profile from ``name`` (built-in) or ``name=down/up/latency``; ``ValueError`` if bad."""
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


def links_of(results: Mapping[str, Any]) -> list[LinkProfile]:
    """The link profiles of ``results``."""
    return [LinkProfile.from_json(x) for x in results.get("links") or []]


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
    slowest = max(float(c) + link.down_seconds(d) + link.up_seconds(u) for c, d, u in clients)
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
    return next((t for row, t in zip(history, times, strict=True)
                 if float(row["accuracy"]) >= target), None)


def _rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.4g} {unit}"
    return f"{bps:.4g} bit/s"


def _latency(s: float) -> str:
    return f"{s * 1e3:g} ms" if s >= 1e-3 or s == 0 else f"{s * 1e6:g} us"
