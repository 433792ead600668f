"""Dict samples of one number a column (a table read as a Hugging Face ``Dataset``)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from dq_flower import sample_keys
from dq_flower.codecs import PayloadError
from dq_flower.data_input import as_arrays, as_inputs
from dq_flower.model_check import check_model, placeholder_rows
from dq_flower.wire.dq_batch import DataSpec

RNG = np.random.default_rng(3)
N = 12
AGE = RNG.integers(20, 85, N)
BMI = RNG.normal(27, 5, N).astype(np.float32)
SMOKER = RNG.random(N) < 0.3
LABEL = RNG.integers(0, 2, N)


def rows() -> list[dict]:
    """Items as a table's rows come: numpy and Python numbers, a bool, the label last."""
    return [{"age": np.int64(AGE[i]), "bmi": float(BMI[i]), "smoker": bool(SMOKER[i]),
             "label": int(LABEL[i])} for i in range(N)]


def table() -> np.ndarray:
    return np.stack([AGE, BMI, SMOKER], 1).astype(np.float32)


class Told(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_columns_are_read_side_by_side_in_order_the_target_apart_and_told_once(monkeypatch):
    monkeypatch.setattr(sample_keys, "_TOLD", set())  # told in no earlier test
    told = Told()
    logging.getLogger("flwr").addHandler(told)
    try:
        x, y = as_arrays(rows())
        as_arrays(rows())
    finally:
        logging.getLogger("flwr").removeHandler(told)
    np.testing.assert_allclose(x, table(), rtol=1e-6)
    assert x.dtype == np.float32 and y.dtype == np.int64 and y.tolist() == LABEL.tolist()
    said = [line for line in told.lines if "one number a column" in line]
    assert said == ["dict samples of one number a column: inputs age, bmi, smoker side by "
                    "side, target 'label'"]
    named = [{"x": float(BMI[i]), "label": int(LABEL[i]), "id": i} for i in range(N)]
    x, _ = as_arrays(named)  # "x" is an input's name: the input, the id left out, as before
    np.testing.assert_allclose(x[:, 0], BMI)


def test_a_hugging_face_table_with_torch_format_and_its_loader():
    datasets = pytest.importorskip("datasets")
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"age": AGE, "bmi": BMI, "smoker": SMOKER,
                          "visits": (AGE % 7).astype(np.uint8), "label": LABEL})
    part = datasets.Dataset.from_pandas(frame).with_format("torch")
    want = np.c_[table(), AGE % 7]
    for data in (part, DataLoader(part, batch_size=5, shuffle=True)):
        x, y, parts = as_inputs(data)
        np.testing.assert_allclose(x, want, rtol=1e-6)
        assert parts == () and y.tolist() == LABEL.tolist()


class ColumnStream(IterableDataset):
    def __iter__(self):
        for item in rows():
            yield {k: torch.tensor(v) for k, v in item.items()}


def test_a_stream_of_column_dicts_is_read_by_batch():
    x, y = as_arrays(DataLoader(ColumnStream(), batch_size=5))
    np.testing.assert_allclose(x, table(), rtol=1e-6)
    assert y.tolist() == LABEL.tolist()


def test_keys_name_the_input_columns_in_their_order():
    x, y = as_arrays(rows(), keys=(["smoker", "age"], "label"))
    np.testing.assert_allclose(x, table()[:, [2, 0]])
    data = [{**r, "target": r.pop("label")} for r in rows()]  # no common target name
    x, y = as_arrays(data, keys=(("bmi",), "target"))
    assert x.shape == (N, 1) and y.tolist() == LABEL.tolist()
    with pytest.raises(ValueError, match=r"names \['height'\], which it lacks"):
        as_arrays(rows(), keys=(["age", "height"], "label"))
    image = [{**r, "img": np.zeros((2, 2))} for r in rows()]  # an array: keys are inputs
    x, y, parts = as_inputs(image, keys=(["age", "img"], "label"))
    assert parts == ("i", "f2x2") and x.shape == (N, 5) and x[:, 0].tolist() == AGE.tolist()
    with pytest.raises(ValueError, match="samples of 2 inputs: these devices train on one"):
        as_arrays(image, keys=(["age", "img"], "label"))


def test_a_text_column_or_no_target_is_refused_naming_what_to_do():
    text = [{**r, "city": "Lyon"} for r in rows()]
    with pytest.raises(ValueError, match=r"'city' \(str\) not a number"):
        as_arrays(text)
    unnamed = [{k: v for k, v in r.items() if k != "label"} | {"outcome": 1} for r in rows()]
    with pytest.raises(ValueError, match=r"found no input.*keys=\(\[\"age\", \"bmi\"\]"):
        as_arrays(unnamed)


class Broadcasting(torch.nn.Module):
    """Standardises by constants of six columns: a row of one broadcasts against them."""

    def __init__(self) -> None:
        super().__init__()
        self.mean = torch.zeros(6)
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(),
                                        torch.nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x - self.mean)


class Ids(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(x.long(), 10).flatten(1).float()


@pytest.mark.parametrize("width", [1, 5])
def test_the_server_refuses_rows_other_than_the_models_first_layer(width):
    spec = DataSpec((width,))
    model = Broadcasting()
    if width == 5:  # no broadcast: refused all the same, naming both widths
        model.forward = model.body  # type: ignore[method-assign]
    with pytest.raises(PayloadError, match=rf"rows of width {width}, the model's "
                                           "first layer takes width 6"):
        check_model(model, spec, *placeholder_rows(spec), None)
    assert check_model(Broadcasting(), DataSpec((6,)), *placeholder_rows(DataSpec((6,))),
                       None) == 2
    conv = torch.nn.Sequential(torch.nn.Unflatten(1, (1, 9)), torch.nn.Conv1d(1, 2, 3),
                               torch.nn.Flatten(), torch.nn.Linear(14, 2))
    assert check_model(conv, DataSpec((9,)), *placeholder_rows(DataSpec((9,))), None) == 2
    ids = torch.nn.Sequential(Ids(), torch.nn.Linear(40, 2))  # widens its rows itself
    assert check_model(ids, DataSpec((4,)), *placeholder_rows(DataSpec((4,))), None) == 2
