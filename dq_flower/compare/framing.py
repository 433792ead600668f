"""Links with a payload limit: a message goes as frames of at most N bytes.

A LoRaWAN frame carries at most 51 to 222 application bytes (EU868, by data rate), an
Iridium Short Burst Data message 340 bytes up and 270 down. On such a link a message of
``B`` bytes takes ``n = ceil(B / N)`` frames; each occupies the channel ``frame_s`` (its
airtime, headers included, or the per-message delivery time), and a duty-cycle limit
``dc`` keeps the sender silent ``frame_s * (1 / dc - 1)`` after each frame but the last::

    T(B) = n * frame_s + (n - 1) * frame_s * (1 / dc - 1)

Every frame, the last included, is counted as a full one (an upper bound by less than one
frame's time).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Framing", "LORAWAN_HEADER_BYTES", "EU868_MAX_PAYLOAD", "lora_airtime",
           "lorawan_framing", "iridium_sbd_seconds"]


@dataclass(frozen=True)
class Framing:
    """One direction of a link that carries at most ``payload_bytes`` per frame."""

    payload_bytes: int  # message bytes per frame, the link's own headers not included
    frame_s: float  # seconds a full frame occupies the channel
    duty_cycle: float = 1.0  # fraction of the time the sender may transmit

    def __post_init__(self) -> None:
        if not (isinstance(self.payload_bytes, int) and self.payload_bytes >= 1):
            raise ValueError(f"payload_bytes must be an int >= 1, got {self.payload_bytes!r}")
        if not (0 < self.frame_s < float("inf")):
            raise ValueError(f"frame_s must be positive, got {self.frame_s!r}")
        if not (0 < self.duty_cycle <= 1):
            raise ValueError(f"duty_cycle must be in (0, 1], got {self.duty_cycle!r}")

    def frames(self, nbytes: float) -> int:
        """Frames a message of ``nbytes`` bytes takes (0 for an empty one)."""
        return math.ceil(float(nbytes) / self.payload_bytes) if nbytes > 0 else 0

    def seconds(self, nbytes: float) -> float:
        """Seconds to send ``nbytes`` bytes: airtime plus the duty cycle's silences."""
        n = self.frames(nbytes)
        if n == 0:
            return 0.0
        return n * self.frame_s + (n - 1) * self.frame_s * (1.0 / self.duty_cycle - 1.0)

    def describe(self) -> str:
        """``frames of 222 B, 369 ms each, 1% duty cycle``."""
        text = f"frames of {self.payload_bytes} B, {_seconds(self.frame_s)} each"
        if self.duty_cycle < 1:
            text += f", {self.duty_cycle * 100:g}% duty cycle"
        return text

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (the fields)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Framing | None:
        """Inverse of :meth:`to_json` (``None`` for ``None``)."""
        if data is None:
            return None
        return cls(int(data["payload_bytes"]), float(data["frame_s"]),
                   float(data.get("duty_cycle", 1.0)))


#: LoRaWAN 1.0.x MAC overhead per frame: MHDR 1 + FHDR 7 (no FOpts) + FPort 1 + MIC 4 bytes
#: (LoRaWAN L2 1.0.4 specification, section 4). FHDR's frame counter orders the frames.
LORAWAN_HEADER_BYTES = 13

#: EU868 maximum application payload (FRMPayload, no FOpts) by data rate: DR0-DR2 51,
#: DR3 115, DR4-DR5 222 bytes (LoRaWAN Regional Parameters RP002-1.0.x, EU863-870).
EU868_MAX_PAYLOAD = {0: 51, 1: 51, 2: 51, 3: 115, 4: 222, 5: 222}


def lora_airtime(phy_payload_bytes: int, sf: int, bandwidth_hz: float = 125e3,
                 coding_rate: int = 1, preamble_symbols: int = 8,
                 explicit_header: bool = True, crc: bool = True) -> float:
    """Seconds on air of one LoRa frame (Semtech SX1276 datasheet, section 4.1.1.7).

    ``T = (preamble + 4.25) T_sym + (8 + max(ceil((8 PL - 4 SF + 28 + 16 CRC - 20 IH) /
    (4 (SF - 2 DE))) (CR + 4), 0)) T_sym`` with ``T_sym = 2^SF / BW``; the low data rate
    optimisation ``DE`` is on where ``T_sym`` exceeds 16 ms (SF11 and SF12 at 125 kHz).
    """
    t_sym = 2.0 ** sf / bandwidth_hz
    de = 1 if t_sym > 0.016 else 0
    ih = 0 if explicit_header else 1
    num = 8 * phy_payload_bytes - 4 * sf + 28 + 16 * int(crc) - 20 * ih
    payload_symbols = 8 + max(math.ceil(num / (4 * (sf - 2 * de))) * (coding_rate + 4), 0)
    return (preamble_symbols + 4.25) * t_sym + payload_symbols * t_sym


def lorawan_framing(data_rate: int, duty_cycle: float) -> Framing:
    """EU868 data rate ``data_rate`` (DR0-DR5: SF12-SF7 at 125 kHz), full frames."""
    if data_rate not in EU868_MAX_PAYLOAD:
        raise ValueError(f"EU868 data rate must be 0 to 5, got {data_rate!r}")
    payload = EU868_MAX_PAYLOAD[data_rate]
    airtime = lora_airtime(payload + LORAWAN_HEADER_BYTES, sf=12 - data_rate)
    return Framing(payload, airtime, duty_cycle)


def iridium_sbd_seconds(message_bytes: int) -> float:
    """Delivery time of one Iridium SBD message: ``5 s + 15 s * bytes / 1960``.

    The line through about 5 s for a short message and 20 s for a 1960-byte one (NAL
    Research, 'Short Burst Data', http://nalresearch.com/NetRef_SBD.html).
    """
    return 5.0 + 15.0 * float(message_bytes) / 1960.0


def _seconds(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"
