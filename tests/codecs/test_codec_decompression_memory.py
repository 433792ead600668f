"""Decompression is bounded in memory as well as in output: xz dictionaries, zstd windows.

Every stream here reaches the decoder the way a reply reaches the server: a payload turned
into its record and back (:meth:`Payload.from_record`), then decoded by the codec, through
:func:`dq_flower.wire.gradient.decode_update` where a whole update is decoded.
"""

from __future__ import annotations

import io
import lzma
import os
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest

from dq_flower.codecs import Payload, PayloadError, make
from dq_flower.codecs.entropy import compress, decompress
from dq_flower.codecs.lossless import STREAM, coder_of
from dq_flower.wire.gradient import decode_update

zstandard = pytest.importorskip("zstandard")

ROOT = Path(__file__).resolve().parents[2]
KEY = "compression-update"
#: LZMA2's dictionary byte for 4 GiB - 1 bytes (the largest an xz stream can declare).
DICT_4GIB = 40
#: LZMA2's dictionary byte for 8 MiB (what ``preset=6`` declares).
DICT_8MIB = 22


def _vector(n=500):
    return np.resize(np.linspace(-1, 1, 8, dtype=np.float32), n)


def _coded(method, n=500):
    """An honest entropy-coded ``identity`` payload of ``n`` values, and its raw bytes."""
    p = make("identity", entropy=method).encode(_vector(n))
    assert coder_of(p) == method
    return p, _vector(n).tobytes()


def _with_stream(p: Payload, stream: bytes) -> Payload:
    buf = np.frombuffer(stream, dtype=np.uint8).copy()
    return Payload(p.codec, p.shape, dict(p.meta), {STREAM: buf}, nbits=8 * buf.size,
                   version=p.version)


def _received(p: Payload, method):
    """Decode ``p`` as the server decodes a reply's update (record and back, then decode)."""
    size = int(np.prod(p.shape))
    return decode_update({KEY: p.to_record()}, [KEY], [size], make("identity", entropy=method))


def _xz_declaring(raw: bytes, dict_byte: int) -> bytes:
    """An xz stream of ``raw`` whose (only) LZMA2 filter declares dictionary ``dict_byte``.

    The data is coded with a 1 MiB dictionary, so it decodes with any larger one; only the
    block header's dictionary byte (and the header's CRC32) is rewritten, so nothing large
    is ever allocated while crafting it.
    """
    stream = bytearray(lzma.compress(raw, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                                     filters=[{"id": lzma.FILTER_LZMA2,
                                               "dict_size": 1 << 20}]))
    start = 12  # the stream header's 12 bytes, then the first block header
    size = (stream[start] + 1) * 4
    assert stream[start + 1:start + 4] == b"\x00\x21\x01"  # one filter, LZMA2, 1 props byte
    stream[start + 4] = dict_byte
    crc = zlib.crc32(bytes(stream[start:start + size - 4]))
    stream[start + size - 4:start + size] = crc.to_bytes(4, "little")
    return bytes(stream)


def _zstd_frame(raw: bytes, window_log: int) -> bytes:
    """A zstd frame of ``raw`` declaring a ``2**window_log`` window (no content size)."""
    params = zstandard.ZstdCompressionParameters(window_log=window_log,
                                                 write_content_size=False)
    cobj = zstandard.ZstdCompressor(compression_params=params).compressobj()
    frame = cobj.compress(raw) + cobj.flush()
    assert zstandard.get_frame_parameters(frame).window_size == 1 << window_log
    return frame


# ----------------------------------------------------------------------------- xz / lzma
def test_an_xz_stream_declaring_a_4_gib_dictionary_is_refused_by_the_memory_limit():
    # Prepare: an honest lzma payload whose stream is replaced by one declaring 4 GiB
    p, raw = _coded("lzma")
    bomb = _xz_declaring(raw, DICT_4GIB)
    assert len(bomb) < 128  # a hundred-odd bytes
    assert lzma.decompress(_xz_declaring(raw, DICT_8MIB)) == raw  # the data itself is valid
    # Execute / Assert: the reply is refused with a reason naming the memory limit
    with pytest.raises(PayloadError, match=r"lzma stream needs more than its memory limit"):
        _received(_with_stream(p, bomb), "lzma")


def test_refusing_the_4_gib_dictionary_does_not_reserve_it():
    # Prepare: a fresh interpreter reports its peak virtual memory before and after
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests" / "codecs")!r})
        from test_codec_decompression_memory import (DICT_4GIB, _coded, _received,
                                                     _with_stream, _xz_declaring)
        from dq_flower.codecs import PayloadError

        def peak():
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmPeak"))

        p, raw = _coded("lzma")
        bad = _with_stream(p, _xz_declaring(raw, DICT_4GIB))
        _received(p, "lzma")  # an honest payload first: the decoder's own working memory
        before = peak()
        try:
            _received(bad, "lzma")
        except PayloadError as exc:
            print("refused", exc, file=sys.stderr)
        print(peak() - before)
    """)
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc/self/status (Linux) to read the peak virtual memory")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # Execute
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120, check=True)
    grown_kib = int(done.stdout.strip().splitlines()[-1])
    # Assert: refused, and the peak grew by far less than the 4 GiB declared (a few MiB)
    assert "refused" in done.stderr
    assert grown_kib < 64 << 10, done.stderr


@pytest.mark.parametrize("fmt", [lzma.FORMAT_ALONE, lzma.FORMAT_RAW])
def test_lzma_accepts_only_the_xz_format_its_encoder_writes(fmt):
    p, raw = _coded("lzma")
    filters = [{"id": lzma.FILTER_LZMA1, "dict_size": 1 << 20}] if fmt == lzma.FORMAT_RAW \
        else None
    other = lzma.compress(raw, format=fmt, filters=filters)
    with pytest.raises(PayloadError, match=r"not an xz stream"):
        _received(_with_stream(p, other), "lzma")


# ----------------------------------------------------------------------------- zstd
def test_a_zstd_frame_asking_for_a_128_mib_window_is_refused():
    p, raw = _coded("zstd")
    frame = _zstd_frame(raw, 27)
    with pytest.raises(PayloadError, match=r"zstd frame asks for a 134217728-byte window"):
        _received(_with_stream(p, frame), "zstd")


def test_the_zstd_window_limit_is_enforced_by_the_decompressor_itself(monkeypatch):
    # Prepare: the header check is blinded, so only the decompressor's own limit remains
    p, raw = _coded("zstd")
    frame = _zstd_frame(raw, 27)

    class Blind:
        window_size, content_size, dict_id = 1 << 10, zstandard.CONTENTSIZE_UNKNOWN, 0

    monkeypatch.setattr(zstandard, "get_frame_parameters", lambda data: Blind)
    # Execute / Assert
    with pytest.raises(PayloadError, match=r"window above its memory limit"):
        _received(_with_stream(p, frame), "zstd")


def test_zstd_accepts_only_a_zstd_frame_not_a_skippable_one():
    p, raw = _coded("zstd")
    skippable = (0x184D2A50).to_bytes(4, "little") + (4).to_bytes(4, "little") + b"abcd"
    with pytest.raises(PayloadError, match=r"not a zstd frame"):
        _received(_with_stream(p, skippable + bytes(p.buffers[STREAM])), "zstd")


# ----------------------------------------------------------------------------- MemoryError
class _OutOfMemory:
    """A decompressor (or its reader) that runs out of memory as soon as it is used."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise MemoryError()
        return fail


@pytest.mark.parametrize("method", ["zlib", "lzma", "zstd"])
def test_a_memory_error_inside_a_decompressor_is_a_refusal_with_a_reason(monkeypatch, method):
    # Prepare
    p, _ = _coded(method)
    target = {"zlib": (zlib, "decompressobj"), "lzma": (lzma, "LZMADecompressor"),
              "zstd": (zstandard, "ZstdDecompressor")}[method]
    monkeypatch.setattr(*target, _OutOfMemory)
    # Execute / Assert
    with pytest.raises(PayloadError, match=rf"{method} stream ran out of memory") as info:
        _received(p, method)
    assert "MemoryError" in str(info.value)


# ----------------------------------------------------------------------------- honest payloads
@pytest.mark.parametrize("method", ["zlib", "lzma", "zstd"])
@pytest.mark.parametrize("size", [1, 1000, (1 << 20) + 1, 9 << 20])
def test_honest_streams_of_every_size_still_decode(method, size):
    # 9 MiB: above lzma's 8 MiB dictionary (preset 6) and zstd's 8 MiB window (level 19)
    rng = np.random.default_rng(size)
    data = np.repeat(rng.integers(0, 4, -(-size // 64), dtype=np.uint8), 64)[:size]
    stream = compress(data, method)
    np.testing.assert_array_equal(decompress(stream, method, size), data)


def test_an_honest_small_lzma_stream_declares_8_mib_and_decodes():
    # preset 6 declares its 8 MiB dictionary whatever the message's size: the floor covers it
    p, _ = _coded("lzma", n=200)
    assert bytes(p.buffers[STREAM][12:16]) == b"\x02\x00\x21\x01"
    assert int(p.buffers[STREAM][16]) == DICT_8MIB
    np.testing.assert_array_equal(_received(p, "lzma")[0], _vector(200))


@pytest.mark.parametrize("method", ["zlib", "lzma", "zstd"])
def test_a_full_model_of_millions_of_parameters_still_decodes(method):
    # 2.2 million values (8.8 MB raw): past the encoders' 8 MiB dictionary and window
    rng = np.random.default_rng(0)
    x = np.tile(rng.standard_normal(4096).astype(np.float32), 540)[:2_200_000]
    p = make("identity", entropy=method).encode(x)
    assert coder_of(p) == method
    if method == "zstd":
        assert zstandard.get_frame_parameters(bytes(p.buffers[STREAM])).window_size == 8 << 20
    vec, nbits, raw = _received(p, method)
    np.testing.assert_array_equal(vec, x)
    assert nbits == p.nbits and raw == 32 * x.size


def test_a_zstd_frame_declaring_another_content_size_is_refused_before_decoding():
    p, raw = _coded("zstd")
    other = zstandard.ZstdCompressor(level=19).compress(raw + b"\x00\x00\x00\x00")
    with pytest.raises(PayloadError, match=r"declares 2004 bytes, expected 2000"):
        _received(_with_stream(p, other), "zstd")
    assert zstandard.ZstdDecompressor().stream_reader(io.BytesIO(other)).read() \
        == raw + bytes(4)
