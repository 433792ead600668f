"""The Python docs as text, and a small model pretrained on a corpus and cached."""

from __future__ import annotations

import pytest
import torch

from dq_flower.harness.tasks.data.pydocs import html_text, python_docs_text
from dq_flower.harness.tasks.pretrain import (
    PretrainSettings,
    byte_windows,
    pretrained_char_transformer,
)

PAGE = """<html><head><style>p {color: red}</style><script>var x = 1;</script></head>
<body><div class="related"><a href="i.html">index</a></div>
<h1>json &mdash; JSON   encoder</h1><p>Encode <code>obj</code>
as JSON.</p><div class="sphinxsidebar"><div>Search</div><p>nav</p></div>
<div class="body"><p>Decoding&nbsp;too.</p></div></body></html>"""


def test_html_text_keeps_the_text_outside_navigation_scripts_and_styles():
    assert html_text(PAGE) == "json \u2014 JSON encoder\nEncode obj\nas JSON.\nDecoding\xa0too."


def test_python_docs_text_reads_pages_in_path_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.html").write_text("<p>second</p>")
    (tmp_path / "a.html").write_text("<p>first</p>")
    assert python_docs_text(tmp_path) == "first\n\nsecond"
    assert python_docs_text(tmp_path, max_chars=3) == "fir"
    with pytest.raises(FileNotFoundError, match="python3.11-doc"):
        python_docs_text(tmp_path / "none")


def test_byte_windows_are_consecutive_utf8_bytes():
    w = byte_windows("abcdefg", 3)
    assert w.tolist() == [[97, 98, 99], [100, 101, 102]]
    assert byte_windows("ab", 3).shape == (0, 3)


def test_pretraining_is_seeded_lowers_the_loss_and_is_cached(tmp_path):
    text = "the quick brown fox jumps over the lazy dog. " * 40
    settings = PretrainSettings(window=16, steps=30, batch_size=8, lr=1e-2, seed=3)
    model = pretrained_char_transformer(text, settings, corpus="fox", cache_dir=tmp_path)
    (cached,) = tmp_path.glob("char-transformer-fox-*.pt")
    again = pretrained_char_transformer(text, settings, corpus="fox", cache_dir=tmp_path)
    fresh = pretrained_char_transformer(text, settings)  # no cache: trained anew, same seed
    for a, b, c in zip(model.state_dict().values(), again.state_dict().values(),
                       fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    other = pretrained_char_transformer(text + ".", settings, corpus="fox", cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.pt"))) == 2  # another text, another file
    assert not torch.equal(other.head.weight, model.head.weight)
    assert cached.exists()
    from dq_flower.harness.tasks.char_lm import CharTransformer, perplexity

    torch.manual_seed(3)
    untrained = CharTransformer(256, 16)
    windows = byte_windows(text, 16)
    assert perplexity(model, windows) < 0.5 * perplexity(untrained, windows)
