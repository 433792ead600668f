"""``None`` means "not set"; method presets keep their own defaults; shared groups."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import tomllib
import torch

from dq_flower.baselines.config import FedAvgConfig, GradientConfig
from dq_flower.codecs import coder_for, make, payload_coder
from dq_flower.compression.config import CompressionConfig
from dq_flower.config import (
    Knob,
    OptimizerConfig,
    RobustConfig,
    client_keys,
    knob_of,
    knobs_of,
    read,
    write,
)
from dq_flower.dq.config import DQConfig
from dq_flower.harness.methods import get_method, method_names
from dq_flower.harness.task_config import TaskConfig
from simulations.inline_docs import knob_table

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
SHORTCUTS = ("levels", "bucket", "ratio", "rank")

#: The "not set" table the run-config reader used before the knobs declared their own
#: spellings (a literal copy, so that the presets that replaced it are checked against it).
OLD_NEUTRAL_VALUES = {
    "codec-params": "", "levels": 0, "bucket": 0, "ratio": 0.0, "rank": 0,
    "local-epochs": 0, "downlink": "auto", "aggregation": "auto", "error-feedback": "auto",
    "per-tensor": "auto", "clip-factor": 1.0, "weight-cap": 2.0, "min-cosine": -0.1,
}
#: The methods' own defaults as the registry listed them before they became config
#: subclasses (a literal copy).
_FEDAVG_EPOCH = {"local-epochs": 1, "clip-factor": 0.0, "weight-cap": 0.0, "min-cosine": -1.0,
                 "downlink": "float32"}
OLD_DEFAULTS = {
    "dq": {}, "upload-all": {"upload-schedule": "all"},
    "upload-all-8bit": {"upload-schedule": "all", "bits": 8}, "fedavg": {},
    **{name: {"codec": codec} for name, codec in (
        ("sgd", "identity"), ("fp16", "fp16"), ("qsgd", "qsgd"), ("terngrad", "terngrad"),
        ("ef-signsgd", "ef-sign"), ("topk", "topk"), ("powersgd", "powersgd"),
        ("bingrad", "bingrad"), ("orq", "orq"))},
    "signsgd": {"codec": "sign", "lr": 0.005},
    "fedavg-qsgd2": {"codec": "qsgd", "levels": 1, **_FEDAVG_EPOCH},
    "fedavg-qsgd4": {"codec": "qsgd", "levels": 7, **_FEDAVG_EPOCH},
    "fedavg-ef-sign": {"codec": "ef-sign", **_FEDAVG_EPOCH},
    "fedavg-topk": {"codec": "topk", "ratio": 0.01, **_FEDAVG_EPOCH},
    "fedavg-fp16": {"codec": "fp16", **_FEDAVG_EPOCH, "downlink": "fp16"},
    "fedavg-fp32": {"codec": "identity", **_FEDAVG_EPOCH},
}


def _old_same(value, neutral):
    if isinstance(value, bool) or type(value) not in (type(neutral), int, float, str):
        return False
    return value == neutral


def _old_merged(name, run_config):
    out = dict(OLD_DEFAULTS[name])
    for key, value in run_config.items():
        if key in out and key in OLD_NEUTRAL_VALUES and _old_same(value,
                                                                  OLD_NEUTRAL_VALUES[key]):
            continue
        out[key] = value
    return out


def _read_as_before(name, run_config):
    """What the old reader built: the strategy's own config over the merged table."""
    method = get_method(name)
    root = getattr(method.config_cls, "preset_of", method.config_cls)
    return [write(read(cls, _old_merged(name, run_config)))
            for cls in (root, method.client_config_cls) if cls is not None]


def _read_now(name, run_config):
    return [write(read(cls, run_config)) for cls in get_method(name).config_classes()]


def _pyproject_run_config():
    return tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]


# ------------------------------------------------------------------ None means not set
@pytest.mark.parametrize("cls", [GradientConfig, CompressionConfig])
def test_the_codec_shortcuts_default_to_none(cls):
    cfg = cls(codec="qsgd")
    assert all(getattr(cfg, name) is None for name in SHORTCUTS)
    assert cfg.codec_kwargs == {"levels": 4, "bucket": 512}  # the codec's defaults


@pytest.mark.parametrize("cls", [GradientConfig, CompressionConfig])
def test_the_old_spelling_zero_is_normalised_to_none(cls):
    cfg = cls(codec="qsgd", levels=0, bucket=0, ratio=0.0, rank=0)
    assert all(getattr(cfg, name) is None for name in SHORTCUTS)
    assert cls(codec="qsgd", levels=0) == cls(codec="qsgd")


def test_gradient_local_epochs_not_set_is_none():
    assert GradientConfig().local_epochs is None and not GradientConfig().epochs_mode
    assert GradientConfig(local_epochs=0) == GradientConfig()
    assert read(GradientConfig, {"local-epochs": 0}).local_epochs is None
    cfg = read(GradientConfig, {"local-epochs": 2})
    assert cfg.local_epochs == cfg.epochs == 2 and cfg.epochs_mode


def test_fedavg_local_epochs_not_set_is_one():
    assert FedAvgConfig().local_epochs == 1
    assert FedAvgConfig(local_epochs=0).local_epochs == 1
    assert FedAvgConfig(local_epochs=None).local_epochs == 1
    assert read(FedAvgConfig, {"local-epochs": 0}).local_epochs == 1
    assert read(FedAvgConfig, {"local-epochs": 3}).local_epochs == 3


@pytest.mark.parametrize("cls", [GradientConfig, CompressionConfig])
def test_the_run_config_spelling_of_not_set_maps_to_none(cls):
    cfg = read(cls, {"codec": "topk", "levels": 0, "bucket": 0.0, "ratio": 0,
                             "rank": 0})
    assert all(getattr(cfg, name) is None for name in SHORTCUTS)
    cfg = read(cls, {"codec": "qsgd", "levels": 0, "bucket": 64})
    assert (cfg.levels, cfg.bucket, cfg.ratio) == (None, 64, None)
    assert read(cls, {"codec": "topk", "ratio": 0.05}).ratio == 0.05


@pytest.mark.parametrize(("mapping", "key"), [
    ({"levels": "one"}, "levels"), ({"ratio": "a tenth"}, "ratio"), ({"rank": 1.5}, "rank"),
    ({"bucket": True}, "bucket"),
])
@pytest.mark.parametrize("cls", [GradientConfig, CompressionConfig])
def test_a_wrong_type_for_an_optional_knob_names_its_key(cls, mapping, key):
    with pytest.raises(ValueError, match=f"^{key}: expected"):
        read(cls, {"codec": "qsgd", **mapping})


def _spellings(cls):
    return {k.key: k.unset for k in knobs_of(cls).values() if k.has_unset}


def test_the_fields_declare_their_run_config_spelling_of_not_set():
    spellings = _spellings(GradientConfig)
    assert {k: spellings[k] for k in SHORTCUTS} == {"levels": 0, "bucket": 0, "ratio": 0.0,
                                                      "rank": 0}
    assert spellings["codec-params"] == "" and spellings["downlink"] == "auto"
    assert "lr" not in spellings and "codec" not in spellings  # always a real value
    assert _spellings(FedAvgConfig) == {"local-epochs": 0}


def test_a_config_record_holds_no_none_and_reads_back_the_same():
    cfg = GradientConfig(codec="qsgd", levels=3)
    sent = write(cfg, changed_only=True)
    assert sent["levels"] == 3 and "bucket" not in sent  # None is the default: left out
    full = write(cfg)
    assert full["bucket"] == 0 and full["ratio"] == 0.0  # the run config's "not set"
    assert None not in full.values()
    assert read(GradientConfig, sent) == read(GradientConfig, full) == cfg
    record = CompressionConfig(codec="qsgd", levels=1).message_config()
    assert CompressionConfig.from_message_config(record).bucket is None


# ------------------------------------------------- presets: a method's own defaults
def test_the_declared_spellings_are_the_old_neutral_table():
    spellings: dict[str, list] = {}
    for name in method_names():
        for cls in get_method(name).config_classes():
            for key, value in _spellings(cls).items():
                spellings.setdefault(key, [])
                if value not in spellings[key]:
                    spellings[key].append(value)
    # and "auto" for DQ's knobs whose 0 is auto (the log says "bits auto"; a pyproject's
    # `bits = "auto"` stopped the ServerApp)
    auto = {"bits": ["auto"], "server-threads": ["auto"], "max-abs-value": ["auto"]}
    assert spellings == {**{key: [value] for key, value in OLD_NEUTRAL_VALUES.items()}, **auto}


def test_the_presets_are_the_old_method_defaults():
    for name in method_names():
        method = get_method(name)
        assert method.defaults.items() <= OLD_DEFAULTS[name].items(), name
        assert _read_now(name, {}) == _read_as_before(name, {}), name


@pytest.mark.parametrize("name", method_names())
def test_a_preset_reads_the_pyproject_run_config_as_the_old_table_did(name):
    listed = {**_pyproject_run_config(), "method": name}
    assert _read_now(name, listed) == _read_as_before(name, listed)
    # explicit values: a real value always wins (signsgd's lr=0.1 under tuning, a method's
    # own codec), strings and bools are never "not set" (and so refused where they are not
    # the knob's type, by both)
    for extra in ({"lr": 0.1}, {"codec": "identity"}, {"clip-factor": 0.5},
                  {"levels": 3}, {"levels": "0"}, {"downlink": "fp16"}, {"weight-cap": 2},
                  {"local-epochs": 2}, {"local-epochs": False}, {"min-cosine": -1.0}):
        run_config = {**listed, **extra}
        assert _outcome(_read_now, name, run_config) == \
            _outcome(_read_as_before, name, run_config), extra


def _outcome(reader, name, run_config):
    try:
        return reader(name, run_config)
    except ValueError as exc:
        return f"ValueError: {exc}"


def test_the_methods_own_values_survive_the_pyproject_listing():
    listed = _pyproject_run_config()
    q2 = read(get_method("fedavg-qsgd2").config_cls, listed)
    assert (q2.levels, q2.clip_factor, q2.weight_cap, q2.downlink) == (1, 0.0, 0.0, "float32")
    assert read(FedAvgConfig, listed).local_epochs == 1
    sign = read(get_method("signsgd").config_cls, {**listed, "lr": 0.1})
    assert sign.lr == 0.1 and read(get_method("signsgd").config_cls, listed).lr == 0.005
    # a preset is its base with other defaults: what travels is compared with the base's
    assert isinstance(q2, CompressionConfig)
    assert q2.message_config()["compression-levels"] == 1


# ---------------------------------------------------------------------- shared groups
@pytest.mark.parametrize("cls", [DQConfig, GradientConfig, RobustConfig])
@pytest.mark.parametrize(("kwargs", "key"), [
    ({"clip_factor": -1.0}, "clip-factor"), ({"trim_fraction": 0.5}, "trim-fraction"),
    ({"weight_cap": -0.5}, "weight-cap"), ({"min_cosine": 1.5}, "min-cosine"),
    ({"clip_norm": -1.0}, "clip-norm"), ({"norm_bound_factor": -2.0}, "norm-bound-factor"),
])
def test_a_bad_robust_knob_names_its_key(cls, kwargs, key):
    with pytest.raises(ValueError, match=f"^{key}: "):
        cls(**kwargs)
    with pytest.raises(ValueError, match=f"^{key}: "):
        read(cls, {key: next(iter(kwargs.values()))})


@pytest.mark.parametrize("cls", [DQConfig, GradientConfig, OptimizerConfig])
@pytest.mark.parametrize(("kwargs", "key"), [
    ({"lr": 0.0}, "lr"), ({"momentum": 1.0}, "momentum"), ({"weight_decay": -1.0},
                                                            "weight-decay"),
    ({"optimizer": "lbfgs"}, "optimizer"),
])
def test_a_bad_optimizer_knob_names_its_key(cls, kwargs, key):
    with pytest.raises(ValueError, match=f"^{key}: "):
        cls(**kwargs)


def test_each_config_keeps_its_own_defaults_of_the_shared_knobs():
    # DQ's server chooses its optimizer on its held-out rows by default (``auto``)
    assert DQConfig(optimizer="sgd").optimizer_config == OptimizerConfig(lr=0.05,
                                                                         weight_decay=5e-4)
    assert GradientConfig().optimizer_config == OptimizerConfig(lr=0.1, weight_decay=0.0)
    assert (DQConfig().optimizer, DQConfig().momentum) == ("auto", 0.9)
    assert GradientConfig().optimizer == "sgd"
    assert DQConfig().robust == GradientConfig().robust == RobustConfig(
        trim_fraction=0.2, clip_norm=0.0, clip_factor=1.0, min_cosine=-0.1, weight_cap=2.0,
        norm_bound_factor=5.0)


def test_the_groups_are_flat_on_the_configs():
    cfg = DQConfig(lr=0.3, clip_factor=0.5)
    assert cfg.lr == 0.3 and cfg.robust.clip_factor == 0.5
    assert read(GradientConfig, {"clip-factor": 2.0, "lr": 0.2}).robust.clip_factor \
        == 2.0
    assert isinstance(cfg.robust, RobustConfig) and type(cfg.robust) is RobustConfig
    fields = {f.name for f in dataclasses.fields(RobustConfig)} | {
        f.name for f in dataclasses.fields(OptimizerConfig)}
    assert fields <= {f.name for f in dataclasses.fields(DQConfig)}
    assert fields <= {f.name for f in dataclasses.fields(GradientConfig)}


def test_which_shared_knobs_travel_is_unchanged():
    # the gradient clients apply the vote (lr, weight decay) and Signum's momentum; DQ's
    # clients read none of the shared knobs
    assert set(client_keys(GradientConfig)) == {
        "codec", "codec-params", "levels", "bucket", "ratio", "rank", "local-steps",
        "local-epochs", "batch-size", "client-lr", "lr", "momentum", "weight-decay",
        "downlink", "aggregation", "error-feedback", "per-tensor", "entropy-coder",
        "trim-fraction", "clip-norm", "norm-bound-factor"}
    assert not set(client_keys(DQConfig)) & {
        "lr", "momentum", "weight-decay", "optimizer", "trim-fraction", "clip-norm",
        "clip-factor", "min-cosine", "weight-cap", "norm-bound-factor"}


# ----------------------------------------------------------- one knob descriptor
CONFIGS = (DQConfig, GradientConfig, FedAvgConfig, CompressionConfig, RobustConfig,
           OptimizerConfig, TaskConfig)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_of_every_config_is_a_knob_with_a_meaning(cls):
    # a subclass that re-declared a field with a plain value would drop its check and its
    # row of the generated knob table
    for f in dataclasses.fields(cls):
        found = knob_of(cls, f.name)
        assert isinstance(found, Knob), f"{cls.__name__}.{f.name} is not a Knob"
        assert found.doc, f"{cls.__name__}.{f.name} has no meaning for the knob table"
    rows = knob_table(cls)
    assert len(rows) == 2 + len(dataclasses.fields(cls))


def test_a_knob_checks_as_it_is_set_and_keeps_the_dataclass_frozen():
    with pytest.raises(ValueError, match=r"^bits: must be in 0\.\.8, got 9$"):
        DQConfig(bits=9)
    with pytest.raises(ValueError, match=r"^trim-fraction: must be in \[0, 0\.5\)"):
        GradientConfig(trim_fraction=0.5)
    # an inherited knob with another default keeps the group's check
    with pytest.raises(ValueError, match="^lr: must be > 0"):
        DQConfig(lr=0.0)
    with pytest.raises(ValueError, match="^budget: must be given a value, got None$"):
        DQConfig(budget=None)  # type: ignore[arg-type]
    assert DQConfig(bits=None).bits == 0  # type: ignore[arg-type]  # its "not set": auto
    cfg = DQConfig(bits=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.bits = 4  # type: ignore[misc]
    assert dataclasses.replace(cfg, bits=4).bits == 4 and cfg.bits == 3
    assert DQConfig(bits=3) == cfg and hash(DQConfig(bits=3)) == hash(cfg)


def test_a_not_set_spelling_is_the_default_in_python_too():
    assert GradientConfig(levels=0).levels is None
    assert GradientConfig(codec="qsgd", levels=3).levels == 3
    assert GradientConfig(ratio=0.0).ratio is None
    assert FedAvgConfig(local_epochs=0).local_epochs == 1
    assert FedAvgConfig(local_epochs=None).local_epochs == 1  # type: ignore[arg-type]
    # a knob without a spelling keeps 0 as a value
    assert CompressionConfig(clip_factor=0.0).clip_factor == 0.0
    assert "clip-factor" not in _spellings(CompressionConfig)
    assert _spellings(GradientConfig)["clip-factor"] == 1.0


def test_a_codec_parameter_is_coerced_and_checked_by_its_knob():
    q = make("qsgd", levels=np.int64(3), bucket=np.int32(64))
    assert type(q.levels) is int and type(q.bucket) is int  # the payload's meta stays JSON
    with pytest.raises(ValueError, match="levels must be an integer in 1..127"):
        make("qsgd", levels=0)
    u = make("uniform", bits=2, fixed_range=np.bool_(True), sample_shape=[np.int64(8), 8])
    assert u.fixed_range is True and u.sample_shape == (8, 8)
    with pytest.raises(ValueError, match="sample_shape"):
        make("uniform", sample_shape=(0, 8))
    assert make("powersgd", shape=[np.int64(4), 5]).shape == (4, 5)


def test_the_lossless_stage_is_chosen_in_the_registry():
    assert coder_for("qsgd", "context") == "context"
    assert coder_for("terngrad", "context") == "context"
    assert coder_for("sign", "context") == "zlib" and coder_for("fp16", "context") == "zlib"
    assert coder_for("sign", "lzma") == "lzma"
    assert payload_coder("context") == "zlib" and payload_coder("none") == "none"
    assert GradientConfig(codec="topk", entropy_coder="context").coder == "zlib"
    assert DQConfig().payload_coder == "zlib"


def test_no_field_is_rewritten_behind_a_frozen_dataclass():
    root = Path(__file__).resolve().parents[1] / "dq_flower"
    found = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if "object.__setattr__" in p.read_text()]
    assert found == []


def test_an_unknown_key_is_refused_everywhere_naming_the_nearest_knob():
    from dq_flower.harness.methods import validate_run_config
    from dq_flower.harness.simulate import build_run_config

    with pytest.raises(ValueError, match=r"unknown knob 'bitz' for the package's apps "
                                         r"\(did you mean 'bits'\?\)"):
        validate_run_config({"method": "dq", "bitz": 3})
    with pytest.raises(ValueError, match=r"unknown knob 'server-stepz' for method 'dq' "
                                         r"\(did you mean 'server-steps'"):
        build_run_config("dq", server_stepz=3)
    with pytest.raises(ValueError, match=r"unknown knob 'levelz' \(did you mean 'levels'"):
        from dq_flower.baselines.strategy import GradientStrategy
        GradientStrategy(torch.nn.Linear(2, 2), levelz=3)
    # every key of the package's own run config is known
    cfg = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    validate_run_config(cfg)


def test_every_source_refuses_an_unknown_key_with_the_one_check():
    """Keyword arguments, a strategy's run config, the package's run config, simulate's
    keywords and a strict read: each names the nearest knobs and the same hint."""
    from flwr.serverapp.strategy import FedAvg

    from dq_flower import CompressedUpdates, DQStrategy
    from dq_flower.harness.methods import validate_run_config
    from dq_flower.harness.simulate import build_run_config

    hint = "it was removed: ranges = 'channel' is the same"
    model = torch.nn.Linear(2, 2)
    sources = [
        lambda: DQStrategy(model, per_channel=1),
        lambda: DQStrategy.from_run_config(model, {"per-channel": 1}),
        lambda: CompressedUpdates(FedAvg(), codec="qsgd", per_channel=1),
        lambda: validate_run_config({"method": "dq", "per-channel": 1}),
        lambda: build_run_config("dq", per_channel=1),
        lambda: read(DQConfig, {"per-channel": 1}, strict=True),
    ]
    for build in sources:
        with pytest.raises(ValueError, match=r"'per[-_]channel'.*\(no knob is spelled like "
                                             rf"it\).*{hint}"):
            build()
    assert read(DQConfig, {"per-channel": 1}) == DQConfig()  # not strict: another's key


def test_every_methods_config_pickles_and_names_its_method():
    import pickle

    for name in method_names():
        cls = get_method(name).config_cls
        cfg = read(cls, {})
        assert pickle.loads(pickle.dumps(cfg)) == cfg, name
        assert cls.__doc__ and (cls in (DQConfig, FedAvgConfig) or name in cls.__doc__)
