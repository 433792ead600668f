"""Comparison scenarios ("presets"): small TOML files in ``dq_flower/presets/``.

A preset fixes one scenario (data set, model, clients, partition, rounds, target accuracy,
seed) and the list of methods to run on it, with optional knobs for all methods and per
method. The files are package data: an installed wheel has every one of them. Example
(``dq_flower/presets/digits-mlp.toml``)::

    description = "Handwritten digits (embedded), MLP"
    dataset = "digits"
    model = "mlp"
    num-clients = 4
    rounds = 40
    target-accuracy = 0.9
    run = "all"                # every registered method, or a list of labels

    [knobs]                    # every method that knows a key gets it
    batch-size = 32

    [methods.fedavg]           # knobs of one method
    local-epochs = 1

    [methods.qsgd-tau5]        # a variant: a new label for a registered method
    method = "qsgd"
    local-steps = 5

Every command-line flag of ``dq-flower compare`` overrides the preset's value.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dq_flower.harness.tasks.data.partitions import PARTITION_SCHEMES

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

__all__ = ["Preset", "MethodSpec", "PRESET_DIR", "preset_names",
           "load_preset", "parse_preset", "toml_value", "preset_toml"]

#: Folder of the preset files, inside the package (the wheel ships them).
PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"

_TOP_KEYS = {"name", "description", "dataset", "model", "num-clients", "rounds", "partition",
             "dirichlet-alpha", "fraction-train", "target-accuracy", "high-target-accuracy",
             "seed", "data-dir", "run", "methods", "knobs", "tuning"}


@dataclass(frozen=True)
class MethodSpec:
    """One entry of a comparison: its label, the registered method it runs, its own knobs."""

    label: str  # shown in tables and plots (the method's name, or a variant's)
    method: str
    knobs: Mapping[str, Any] = field(default_factory=dict)  # override the common knobs


@dataclass(frozen=True)
class Preset:
    """A named comparison scenario: the fields of a preset file, hyphens as underscores."""

    name: str  # the file's stem
    description: str = ""  # one line for --list-presets and the summary
    dataset: str = "digits"
    model: str = "mlp"
    num_clients: int = 4  # one partition each
    rounds: int = 20
    partition: str = "iid"  # iid, dirichlet, pathological or natural
    dirichlet_alpha: float = 0.5
    fraction_train: float = 1.0  # of the clients, sampled each round
    target_accuracy: float = 0.9  # whose cost (rounds, uplink bytes) the summary compares
    high_target_accuracy: float = 0.0  # a second target (uplink bytes only; 0: none)
    seed: int = 0
    data_dir: str = ""  # "": the data set's default
    methods: tuple[str, ...] = ("all",)  # labels to run, in order; "all": every method
    knobs: Mapping[str, Any] = field(default_factory=dict)  # for every method knowing them
    # label -> knobs (a label that is not a registered method needs "method")
    method_knobs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # label -> record of a `dq-flower tune` (grid, scores, choice); empty: not tuned
    tuning: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(isinstance(self.num_clients, int) and self.num_clients >= 1, "num-clients",
               f"must be an integer >= 1, got {self.num_clients!r}")
        _check(isinstance(self.rounds, int) and self.rounds >= 1, "rounds",
               f"must be an integer >= 1, got {self.rounds!r}")
        _check(self.partition in PARTITION_SCHEMES, "partition",
               f"must be {', '.join(PARTITION_SCHEMES)}, got {self.partition!r}")
        _check(_number(self.dirichlet_alpha) and self.dirichlet_alpha > 0,
               "dirichlet-alpha", f"must be > 0, got {self.dirichlet_alpha!r}")
        _check(_number(self.fraction_train) and 0 < self.fraction_train <= 1,
               "fraction-train", f"must be in (0, 1], got {self.fraction_train!r}")
        _check(_number(self.target_accuracy) and 0 < self.target_accuracy <= 1,
               "target-accuracy", f"must be in (0, 1], got {self.target_accuracy!r}")
        _check(_number(self.high_target_accuracy) and 0 <= self.high_target_accuracy <= 1,
               "high-target-accuracy",
               f"must be in [0, 1] (0: none), got {self.high_target_accuracy!r}")
        _check(isinstance(self.seed, int) and not isinstance(self.seed, bool), "seed",
               f"must be an integer, got {self.seed!r}")
        _check(len(self.methods) >= 1, "methods", "must name at least one method")
        _check(len(set(self.methods)) == len(self.methods), "methods",
               f"lists a method twice: {list(self.methods)}")
        _check(isinstance(self.tuning, Mapping)
               and all(isinstance(v, Mapping) for v in self.tuning.values()), "tuning",
               "must be a table of [tuning.<label>] tables")

    def with_overrides(self, **changes: Any) -> Preset:
        """A copy with the given fields replaced (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def method_specs(self, available: list[str]) -> list[MethodSpec]:
        """Resolve :attr:`methods` (``"all"``: ``available``) into entries.

        ``ValueError`` for an unknown method or variant.
        """
        labels: list[str] = []
        for label in self.methods:
            labels.extend(available if label == "all" else [label])
        specs = []
        for label in dict.fromkeys(labels):
            knobs = dict(self.method_knobs.get(label, {}))
            method = str(knobs.pop("method", label))
            if method not in available:
                if label == method:
                    raise ValueError(f"unknown method {label!r}; known: "
                                     f"{', '.join(available + self.variants())}")
                raise ValueError(f"variant {label!r}: unknown method {method!r}; known: "
                                 f"{', '.join(available)}")
            specs.append(MethodSpec(label, method, knobs))
        return specs

    def to_toml(self, header: str = "") -> str:
        """The preset as a preset TOML file (``load_preset`` reads it back)."""
        fields = {"name": self.name, "description": self.description, "dataset": self.dataset,
                  "model": self.model, "num-clients": self.num_clients, "rounds": self.rounds,
                  "partition": self.partition, "dirichlet-alpha": self.dirichlet_alpha,
                  "fraction-train": self.fraction_train, "target-accuracy": self.target_accuracy,
                  **({"high-target-accuracy": self.high_target_accuracy}
                     if self.high_target_accuracy else {}),
                  "seed": self.seed, "data-dir": self.data_dir, "run": list(self.methods)}
        tables = {"knobs": {"": dict(self.knobs)},
                  "methods": {k: dict(v) for k, v in self.method_knobs.items()},
                  "tuning": {k: dict(v) for k, v in self.tuning.items()}}
        return preset_toml(fields, tables, header)

    def variants(self) -> list[str]:
        """Labels of ``[methods.<label>]`` tables that name another method (variants)."""
        return [k for k, v in self.method_knobs.items() if "method" in v and v["method"] != k]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ValueError(f"{key}: {message}")


def parse_preset(data: Mapping[str, Any], name: str) -> Preset:
    """Build a :class:`Preset` from a parsed TOML mapping; ``ValueError`` names bad keys.

    The methods to run are ``run`` (a list, or ``"all"``); ``methods`` may hold the same
    list when the file has no ``[methods.<label>]`` tables (TOML forbids both).
    """
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"preset {name!r}: unknown key(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(_TOP_KEYS))}")
    tables = data.get("methods")
    method_knobs: dict[str, dict[str, Any]] = {}
    run: Any = data.get("run", "all")
    if isinstance(tables, Mapping):
        for label, knobs in tables.items():
            if not isinstance(knobs, Mapping):
                raise ValueError(f"preset {name!r}: [methods.{label}] must be a table")
            method_knobs[str(label)] = {_hyphen(k): v for k, v in knobs.items()}
    elif tables is not None:
        if "run" in data:
            raise ValueError(f"preset {name!r}: give the methods to run as 'run' or "
                             "'methods', not both")
        run = tables
    if isinstance(run, str):
        methods = tuple(m.strip() for m in run.split(",") if m.strip())
    elif isinstance(run, list) and all(isinstance(m, str) for m in run):
        methods = tuple(run)
    else:
        raise ValueError(f"preset {name!r}: run must be \"all\" or a list of method names")
    knobs = data.get("knobs", {})
    if not isinstance(knobs, Mapping):
        raise ValueError(f"preset {name!r}: [knobs] must be a table")
    tuning = data.get("tuning", {})
    if isinstance(tuning, Mapping):
        # a record written before it kept its split was tuned on this file's own scenario
        split = tuned_split(data)
        tuning = {label: ({**split, **record} if isinstance(record, Mapping) else record)
                  for label, record in tuning.items()}
    kwargs = {k.replace("-", "_"): v for k, v in data.items()
              if k not in ("methods", "knobs", "name", "run", "tuning")}
    try:
        return Preset(name=str(data.get("name", name)), methods=methods,
                      knobs={_hyphen(k): v for k, v in knobs.items()},
                      method_knobs=method_knobs, tuning=tuning, **kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"preset {name!r}: {exc}") from None


def tuned_split(scenario: Mapping[str, Any]) -> dict[str, Any]:
    """The client-data split of a run config or preset table, as a tuning record keeps it."""
    partition = str(scenario.get("partition", "iid"))
    split: dict[str, Any] = {"partition": partition}
    if partition == "dirichlet":
        split["dirichlet-alpha"] = float(scenario.get("dirichlet-alpha", 0.5))
    return split


def _hyphen(key: str) -> str:
    return str(key).replace("_", "-")


def toml_module() -> Any:
    """``tomllib``, or ``tomli`` on Python 3.10."""
    return tomllib


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"preset file {path}: {exc}") from None


def preset_names(folder: Path | None = None) -> list[str]:
    """Names of the presets in ``folder`` (default :data:`PRESET_DIR`)."""
    folder = PRESET_DIR if folder is None else folder
    return sorted(p.stem for p in folder.glob("*.toml"))


def load_preset(name_or_path: str, folder: Path | None = None) -> Preset:
    """Load a preset by name (``dq_flower/presets/<name>.toml``) or path; ``ValueError`` if bad."""
    folder = PRESET_DIR if folder is None else folder
    path = Path(name_or_path).expanduser()
    if path.suffix == ".toml" or path.is_file():
        if not path.is_file() and path.parent.name == "simulations" \
                and (folder / path.name).is_file():
            path = folder / path.name  # the presets' old folder, named by recorded commands
        if not path.is_file():
            raise ValueError(f"preset file not found: {path}")
        return parse_preset(_read_toml(path), path.stem)
    candidate = folder / f"{name_or_path}.toml"
    if candidate.is_file():
        return parse_preset(_read_toml(candidate), name_or_path)
    raise ValueError(f"unknown preset {name_or_path!r}; known: "
                     f"{', '.join(preset_names(folder))} (or a path to a .toml file)")


_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: str) -> str:
    return key if _BARE.fullmatch(key) else json.dumps(key)


def toml_value(value: Any) -> str:
    """One TOML value (strings quoted, lists and mappings inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(str(k))} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if value is None:
        raise ValueError("TOML has no null value")
    if hasattr(value, "item"):  # numpy scalars
        return toml_value(value.item())
    raise ValueError(f"cannot write {type(value).__name__} as TOML")


def preset_toml(fields: Mapping[str, Any], tables: Mapping[str, Mapping[str, Mapping]],
                header: str = "") -> str:
    """A preset file: ``header`` comments, top-level ``fields``, then the tables.

    ``None`` fields are left out; ``tables`` maps ``section -> label -> table``, written as
    ``[section.label]`` (label ``""``: ``[section]``).
    """
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"{_key(k)} = {toml_value(v)}" for k, v in fields.items() if v is not None]
    for section, entries in tables.items():
        for label, table in entries.items():
            if not table and label:
                continue
            name = _key(section) + (f".{_key(label)}" if label else "")
            lines += ["", f"[{name}]"]
            lines += [f"{_key(str(k))} = {toml_value(v)}" for k, v in table.items()
                      if v is not None]
    return "\n".join(lines) + "\n"
