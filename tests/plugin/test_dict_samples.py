"""Flower's samples as they come: data sets and loaders whose items are dicts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from torch.utils.data import DataLoader, Dataset, IterableDataset

from dq_flower.client import evaluate
from dq_flower.data_input import as_arrays, as_inputs
from dq_flower.harness.inprocess import InProcessGrid

RNG = np.random.default_rng(0)
X = RNG.random((24, 1, 4, 4)).astype(np.float32)
Y = RNG.integers(0, 3, size=24)


class DictDataset(Dataset):
    """A torchvision-style wrapper yielding ``{key_x: tensor, key_y: int}``."""

    def __init__(self, kx: str = "img", ky: str = "label") -> None:
        self.kx, self.ky = kx, ky

    def __len__(self) -> int:
        return len(Y)

    def __getitem__(self, i: int) -> dict:
        return {self.kx: torch.from_numpy(X[i]), self.ky: int(Y[i]), "id": i}


class DictStream(IterableDataset):
    def __iter__(self):
        for i in range(len(Y)):
            yield {"image": torch.from_numpy(X[i]), "labels": int(Y[i])}


def check(arrays) -> None:
    x, y = arrays
    np.testing.assert_array_equal(x, X)
    np.testing.assert_array_equal(y, Y)
    assert x.dtype == np.float32 and y.dtype == np.int64


@pytest.mark.parametrize(("kx", "ky"), [("img", "label"), ("image", "labels"),
                                        ("pixel_values", "y"), ("x", "target"),
                                        ("features", "label"), ("signal", "label")])
def test_common_names_are_found(kx, ky):
    check(as_arrays(DictDataset(kx, ky)))


class TwoKeys(Dataset):
    """Items of two keys, or of flwr-datasets' CIFAR-100 / FEMNIST names with their extras."""

    def __init__(self, kx: str, ky: str, extra: tuple[str, ...] = ()) -> None:
        self.kx, self.ky, self.extra = kx, ky, extra

    def __len__(self) -> int:
        return len(Y)

    def __getitem__(self, i: int) -> dict:
        return {self.kx: torch.from_numpy(X[i]), self.ky: int(Y[i]),
                **{k: 7 for k in self.extra}}


@pytest.mark.parametrize(("kx", "ky", "extra"), [
    ("pixels", "label", ()), ("image", "class", ()), ("x", "digit", ()),  # two keys
    ("img", "fine_label", ("coarse_label",)), ("image", "character", ("writer_id", "hsf_id"))])
def test_two_keys_one_known_and_flower_data_sets_names(kx, ky, extra):
    check(as_arrays(TwoKeys(kx, ky, extra)))


def test_a_shuffling_loader_is_read_in_index_order():
    loader = DataLoader(DictDataset(), batch_size=5, shuffle=True)
    check(as_arrays(loader))


def test_an_iterable_loader_of_dict_batches():
    check(as_arrays(DataLoader(DictStream(), batch_size=7)))


def test_given_keys_and_a_clear_error_otherwise():
    check(as_arrays(DictDataset("pixels", "digit"), keys=("pixels", "digit")))
    check(as_arrays(DictDataset("pixels", "digit")))  # "id" names an id: digit is the target
    two = [{"pixels": X[i], "digit": int(Y[i]), "site": 3} for i in range(4)]
    with pytest.raises(ValueError, match=r"keys \['digit', 'pixels', 'site'\].*keys=") as err:
        as_arrays(two)
    assert "found no target" in str(err.value)  # pixels is an input's name; digit or site?
    with pytest.raises(ValueError, match="names \\['lbl'\\]"):
        as_arrays(DictDataset(), keys=("img", "lbl"))


def test_hugging_face_dataset_with_transform_and_flwr_datasets_partition():
    datasets = pytest.importorskip("datasets")
    from flwr_datasets.partitioner import IidPartitioner

    ds = datasets.Dataset.from_dict({"img": X.reshape(24, -1).tolist(), "label": Y.tolist()})

    def transform(batch):  # the quickstart's apply_transforms: lists to tensors
        batch["img"] = [torch.tensor(v, dtype=torch.float32).reshape(1, 4, 4)
                        for v in batch["img"]]
        return batch

    check(as_arrays(ds.with_transform(transform)))
    check(as_arrays(DataLoader(ds.with_transform(transform), batch_size=8, shuffle=True)))
    partitioner = IidPartitioner(num_partitions=2)
    partitioner.dataset = ds
    part = partitioner.load_partition(0).with_format("numpy")
    x, y = as_arrays(part)
    assert x.shape == (12, 16) and y.shape == (12,)


def test_client_functions_take_dict_samples_and_keys():
    InProcessGrid(lambda m, c: m, 1)  # acts as the server: messages can be built here
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "config": ConfigRecord({"server-round": 1})})
    msg = Message(content, dst_node_id=5, message_type=MessageType.EVALUATE)
    msg.metadata.__dict__["_message_id"] = "e1"
    ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    plain = evaluate(msg, ctx, (X, Y), model=model)
    keyed = evaluate(msg, ctx, DictDataset("pixels", "digit"), model=model,
                     keys=("pixels", "digit"))
    assert dict(keyed.content["metrics"]) == dict(plain.content["metrics"])


def test_integer_multi_labels_become_binary_targets_and_masks_stay_class_labels():
    x = np.zeros((4, 6), dtype=np.float32)
    labels = np.array([[0, 1, 1], [1, 0, 0], [0, 0, 1], [1, 1, 0]])  # MultiLabelBinarizer's
    _, y = as_arrays((x, labels))
    assert y.dtype == np.float32 and y.shape == (4, 3) and (y == labels).all()
    _, y = as_arrays((x, labels[:, :1] * 2))  # one label a sample as a column: (n,)
    assert y.dtype == np.int64 and y.tolist() == [0, 2, 0, 2]
    masks = np.arange(4 * 8 * 8).reshape(4, 8, 8).astype(np.int32) % 3  # a label a pixel
    _, y = as_arrays((x, masks))
    assert y.dtype == np.int64 and y.shape == (4, 8, 8) and (y == masks).all()
    _, y = as_arrays((x, labels * 3))  # per-token tags beyond 0/1: a label an element
    assert y.dtype == np.int64 and y.shape == (4, 3)
    with pytest.raises(ValueError, match=r"shape \(4, 1, 1, 1, 1, 2\).*at most 4 axes"):
        as_arrays((x, np.zeros((4, 1, 1, 1, 1, 2), np.int64)))


def test_a_node_with_no_rows_yet_answers_with_none():
    """An empty data set (a new site) failed every DQ round: "cannot reshape array of size 0"."""
    import dq_flower

    rng = np.random.default_rng(1)
    x, y = rng.random((120, 8), dtype=np.float32), rng.integers(0, 3, 120)

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        rows = slice(node, None, 3) if node < 3 else slice(0, 0)  # node 3: no rows
        data = torch.utils.data.TensorDataset(torch.from_numpy(x[rows]), torch.from_numpy(y[rows]))
        return dq_flower.client.dq_train(msg, context, data)

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    result = dq_flower.DQStrategy(model, seed=0).start(
        grid=InProcessGrid(train, 4), num_rounds=2, initial_arrays=ArrayRecord(model.state_dict()))
    rounds = [result.evaluate_metrics_serverapp[r] for r in (1, 2)]
    assert [m["failed"] for m in rounds] == [0, 0] and [m["rejected"] for m in rounds] == [0, 0]
    assert rounds[-1]["stored"] > 0


def test_federated_evaluation_on_a_node_with_no_rows_weighs_nothing():
    """It raised "empty batch": a failed evaluate reply every round (Flower logs it so)."""
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

    import dq_flower

    InProcessGrid(lambda m, c: m, 1)  # acts as the server: messages can be built here
    model = torch.nn.Sequential(torch.nn.Linear(8, 3))
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "config": ConfigRecord({"server-round": 1})})
    msg = Message(content, dst_node_id=5, message_type=MessageType.EVALUATE)
    msg.metadata.__dict__["_message_id"] = "e1"
    ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    empty = torch.utils.data.TensorDataset(torch.zeros(0, 8), torch.zeros(0, dtype=torch.long))
    reply = dq_flower.client.evaluate(msg, ctx, empty, model=model)
    assert dict(reply.content["metrics"]) == {"eval-loss": 0.0, "num-examples": 0}
    rows = torch.utils.data.TensorDataset(torch.rand(6, 8), torch.tensor([0, 1, 2, 0, 1, 2]))
    full = dq_flower.client.evaluate(msg, ctx, rows, model=model)
    mean = aggregate_metricrecords([reply.content, full.content], "num-examples")
    assert mean["eval-loss"] == pytest.approx(full.content["metrics"]["eval-loss"])


def test_class_names_are_refused_with_how_to_number_them_alike():
    x = np.zeros((4, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="one mapping for every node"):
        as_arrays((x, np.array(["cat", "dog", "cat", "bird"])))
    with pytest.raises(ValueError, match="one mapping for every node"):
        as_arrays((x, np.array(["cat", "dog", "cat", "bird"], dtype=object)))
    with pytest.raises(ValueError, match=r"complex128$"):  # no hint: not names
        as_arrays((x, np.ones(4, dtype=complex)))


def test_samples_of_several_inputs_are_read_side_by_side_with_their_layout():
    """``TensorDataset(x_num, x_cat, y)`` paired x_num with x_cat as float targets, silently."""
    x_num, x_cat = torch.rand(6, 5), torch.arange(18).reshape(6, 3) % 4
    y = torch.arange(6) % 2
    x, labels, parts = as_inputs(torch.utils.data.TensorDataset(x_num, x_cat, y))
    assert parts == ("f5", "i3") and labels.tolist() == y.tolist()
    assert np.array_equal(x, np.concatenate([x_num.numpy(), x_cat.numpy()], 1))
    with pytest.raises(ValueError, match="samples of 2 inputs: these devices train on one"):
        as_arrays(torch.utils.data.TensorDataset(x_num, x_cat, y))  # the gradient baselines

    class Pairs(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return (x_num[i].reshape(1, 5), x_cat[i]), int(y[i])

    x2, _, parts2 = as_inputs(Pairs())
    assert parts2 == ("f1x5", "i3") and np.array_equal(x2, x)
    x3, _, parts3 = as_inputs(DataLoader(Pairs(), batch_size=4))
    assert parts3 == parts2 and np.array_equal(x3, x)

    class WithPath(Dataset):  # (x, y, extra): the extra is not read, as before
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return x_num[i], int(y[i]), f"row-{i}.csv"

    lengths = torch.tensor([3, 5, 2, 5, 4, 1])  # one value a sample: shape ()
    x5, _, parts5 = as_inputs(torch.utils.data.TensorDataset(x_num, lengths, y))
    assert parts5 == ("f5", "i") and x5.shape == (6, 6)
    x4, labels4, parts4 = as_inputs(WithPath())
    assert x4.shape == (6, 5) and labels4.tolist() == y.tolist() and parts4 == ()


def test_the_split_hook_hands_a_model_its_inputs_and_leaves_its_own_calls_alone():
    from dq_flower.model_inputs import split_inputs

    seen = []

    class TwoInputs(torch.nn.Module):
        def forward(self, a, b):
            seen.append((tuple(a.shape), b.dtype))
            return a.sum(dim=(1, 2)) + b.sum(1)

    model = TwoInputs()
    split_inputs(model, ("f1x5", "i3"))
    split_inputs(model, ("f1x5", "i3"))  # once a model: a second call only sets the layout
    flat = torch.cat([torch.ones(2, 5), torch.tensor([[1.2, 0.9, 2.0], [0.0, 3.1, 1.0]])], 1)
    out = model(flat)
    assert seen[-1] == ((2, 1, 5), torch.int64) and out.tolist() == [9.0, 9.0]
    model(torch.ones(2, 1, 5), torch.ones(2, 3, dtype=torch.long))  # the user's own call
    assert seen[-1] == ((2, 1, 5), torch.int64) and len(model._forward_pre_hooks) == 1


def test_rows_with_missing_values_are_left_out_saying_how_to_keep_them(caplog):
    # a node with 8 such rows of 1,000 (the user's model imputing them itself) was refused
    # whole, every round: DQ 0.858 where FedAvg reached 0.892; its other rows now travel
    import logging

    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    x[1, 0], x[3, 1] = np.nan, np.inf
    y = np.arange(5, dtype=np.float32)
    y[4] = np.nan
    with caplog.at_level(logging.WARNING, logger="flwr"):
        xs, ys = as_arrays((x, y))
    assert np.array_equal(xs, x[[0, 2]]) and np.array_equal(ys, y[[0, 2]])
    assert any("3 of 5 rows contain NaN or infinite values and are left out; fill missing "
               "values on the device" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="every row contains NaN or infinite values: DQ"):
        as_arrays((np.full((3, 2), np.nan, np.float32), np.zeros(3, np.int64)))


def test_a_sparse_matrix_is_read_dense_and_text_columns_are_refused_with_a_hint():
    """A ``TfidfVectorizer``'s CSR rows were refused: "x and y need a leading sample axis"."""
    pd = pytest.importorskip("pandas")
    sparse = pytest.importorskip("scipy.sparse")
    dense = np.zeros((6, 5), np.float32)
    dense[np.arange(6), np.arange(6) % 5] = 0.5
    x, y = as_arrays((sparse.csr_matrix(dense), np.arange(6) % 2))
    assert np.array_equal(x, dense) and y.tolist() == [0, 1, 0, 1, 0, 1]
    table = pd.DataFrame({"age": [30.0] * 6, "city": ["Lyon"] * 6})
    with pytest.raises(ValueError, match="text columns: encode them as numbers"):
        as_arrays((table, np.zeros(6, np.int64)))


def test_a_sample_given_as_a_list_or_tuple_of_numbers_stays_one_input():
    class Lists(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return ([0.5 * i, 1.0, 2.0], i % 2) if i % 2 else ((0.5 * i, 1.0, 2.0), i % 2)

    x, y, parts = as_inputs(Lists())
    assert parts == () and x.shape == (4, 3) and x[3].tolist() == [1.5, 1.0, 2.0]


def test_a_pandas_table_of_numbers_and_booleans_is_read_as_numbers():
    """``pd.get_dummies``' bool columns beside float ones, and nullable ``Int64`` columns,
    made an object array that was refused as "text columns" on every node."""
    pd = pytest.importorskip("pandas")
    table = pd.get_dummies(pd.DataFrame({"grade": ["a", "b", "a", "c"],
                                         "alcohol": [12.5, 13.0, 14.2, 11.9]}))
    table["count"] = pd.array([1, 2, 3, 4], dtype="Int64")
    labels = pd.Series(pd.array([0, 1, 1, 0], dtype="Int64"))
    x, y = as_arrays((table, labels))
    assert x.dtype == np.float32 and x.shape == (4, 5) and y.dtype == np.int64
    assert x[:, 0].tolist() == pytest.approx([12.5, 13.0, 14.2, 11.9])
    assert x[:, 1:4].sum(1).tolist() == [1.0] * 4 and x[:, 4].tolist() == [1, 2, 3, 4]
    assert y.tolist() == [0, 1, 1, 0]
    table["count"] = pd.array([1, None, 3, 4], dtype="Int64")  # a missing value: its row out
    x, y = as_arrays((table, labels))
    assert x[:, 4].tolist() == [1, 3, 4] and y.tolist() == [0, 1, 0]
    categories = pd.DataFrame({"age": [30.0, 40.0], "city": pd.Categorical(["Lyon", "Nice"])})
    with pytest.raises(ValueError, match="text columns: encode them as numbers"):
        as_arrays((categories, np.zeros(2, np.int64)))


def test_a_whole_pandas_frame_is_refused_with_what_to_give():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": [1.0, 2.0], "target": [0, 1]})
    with pytest.raises(TypeError, match=r"frame.drop\(columns=\"target\"\), frame\[\"target\"\]"):
        as_arrays(frame)


def test_nested_dict_samples_are_refused_with_what_to_give():
    """``{"sample": {"image": ...}, "meta": {"label": ...}}`` asked for keys= it cannot take
    (they name top-level keys), and with keys= failed as "a table's text columns"."""
    class Nested(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"sample": {"image": torch.zeros(4)}, "meta": {"label": i}}

    for keys in (None, ("sample", "meta")):
        with pytest.raises(ValueError, match="is a dict of dicts"):
            as_arrays(Nested(), keys)


def test_two_unknown_keys_take_the_single_value_for_the_target():
    """``{"measurements": tensor(30), "diagnosis": 1}``: neither a known name, so every reply
    failed asking for keys=; the one holding a single value is the target."""
    class Rows(Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {"measurements": torch.full((4,), float(i)), "diagnosis": i % 2}

    x, y = as_arrays(Rows())
    assert x.shape == (3, 4) and x[2].tolist() == [2.0] * 4 and y.tolist() == [0, 1, 0]
    both = [{"a": np.zeros(2), "b": np.ones(2)}] * 2  # no single value: still asked for keys=
    with pytest.raises(ValueError, match="pass keys="):
        as_arrays(both)


class Tokenized(Dataset):
    """A tokenizer's padded output: ``input_ids``, ``attention_mask``, a label, an id."""

    def __init__(self, n: int = 240, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.y = rng.integers(0, 2, n)
        lengths = rng.integers(3, 12, n)
        self.ids = np.zeros((n, 12), np.int64)
        self.mask = np.zeros((n, 12), np.int64)
        for i, length in enumerate(lengths):  # class 1: words 1..10, class 0: 11..20
            self.ids[i, :length] = rng.integers(1, 11, length) + 10 * (1 - self.y[i])
            self.mask[i, :length] = 1

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": torch.from_numpy(self.ids[i]),
                "attention_mask": torch.from_numpy(self.mask[i]), "label": int(self.y[i]),
                "idx": i}


class MaskedMean(torch.nn.Module):
    """Embedding, mean over the unmasked positions, a linear head: needs the mask."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = torch.nn.Embedding(21, 8), torch.nn.Linear(8, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m = attention_mask.unsqueeze(-1).float()
        return self.head((self.emb(input_ids) * m).sum(1) / m.sum(1).clamp(min=1))


def test_a_tokenizers_mask_is_a_second_input_on_dq_devices_and_left_out_elsewhere():
    data = Tokenized(8)
    x, y, parts = as_inputs(data)
    assert parts == ("i12", "i12") and x.shape == (8, 24)  # ids, then the mask; idx left out
    assert (x[:, 12:] == data.mask).all() and (y == data.y).all()
    ids_only, _, parts = as_inputs(data, one_input=True)  # a model of one input asked so
    assert parts == () and (ids_only == data.ids).all()
    assert (as_arrays(data)[0] == data.ids).all()  # gradient_train: input_ids alone


def test_dq_trains_a_model_that_reads_the_attention_mask():
    import dq_flower
    from dq_flower.harness.inprocess import InProcessGrid as Grid

    test = Tokenized(200, seed=1)

    def accuracy(server_round: int, arrays: ArrayRecord):
        from flwr.app import MetricRecord

        model = MaskedMean()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            pred = model(torch.from_numpy(test.ids), torch.from_numpy(test.mask)).argmax(1)
        return MetricRecord({"accuracy": float((pred.numpy() == test.y).mean())})

    def train(msg, context):
        part = int(context.node_config["partition-id"])
        return dq_flower.client.dq_train(msg, context, Tokenized(120, seed=10 + part))

    model = MaskedMean()
    result = dq_flower.DQStrategy(model, seed=0).start(
        grid=Grid(train, 2), initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2,
        evaluate_fn=accuracy)
    first = result.evaluate_metrics_serverapp[1]
    assert first["rejected"] == 0 and first["stored"] > 0  # refused before: no mask given
    assert first["accuracy"] > 0.9


def test_a_frames_text_and_category_columns_are_named():
    """The error said `x must be numeric, got dtype object`, naming no column."""
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"amount": [1.0, 2.0], "region": pd.Categorical(["n", "s"]),
                          "plan": pd.Series(["basic", "pro"], dtype=object)})
    with pytest.raises(ValueError, match=r"columns 'region' \(category\), 'plan' \(") as err:
        as_arrays((frame, np.array([0, 1])))
    assert "cat.codes" in str(err.value) and "'amount'" not in str(err.value)


def test_a_dict_target_is_refused_where_one_target_a_sample_is_read():
    # a (x, {"cls": ..., "price": ...}) item was refused as "y must hold integer labels or
    # float targets, got dtype object; map class names to ids", which misled; DQ's dq_train
    # reads it (tests/dq/test_dict_targets.py), the gradient baselines' devices do not
    items = [(np.ones(3, np.float32), {"cls": 1, "price": 2.5}) for _ in range(4)]
    with pytest.raises(ValueError, match=r"targets are a dict \(cls=i, price=f\): DQ's "
                                         r"dq_train reads them"):
        as_arrays(items)


def test_an_id_and_text_beside_a_named_input_leave_the_one_number_for_the_target(caplog):
    """A hospital's export, ``{"features", "diagnosis", "record_id", "ward"}``: every reply
    failed asking for keys=; the one number whose key names no id is the target."""
    rows = [{"features": torch.full((3,), float(i), dtype=torch.float16), "diagnosis": i % 2,
             "record_id": 7000 + i, "ward": "ward-0"} for i in range(5)]
    with caplog.at_level("INFO"):
        x, y = as_arrays(rows)
    assert x.shape == (5, 3) and x.dtype == np.float32 and y.tolist() == [0, 1, 0, 1, 0]
    assert "target 'diagnosis'" in caplog.text and "record_id, ward left out" in caplog.text
    camel = [{"features": np.ones(2), "grade": i % 3, "patientId": i} for i in range(3)]
    assert as_arrays(camel)[1].tolist() == [0, 1, 2]
    arrays = [{"acc": np.zeros(4), "gyro": np.ones(4), "activity": i % 2, "sample_idx": i}
              for i in range(4)]  # several inputs: the id is not the target either
    assert as_inputs(arrays)[1].tolist() == [0, 1, 0, 1]
