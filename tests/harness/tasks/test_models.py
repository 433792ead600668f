"""Tests for dq_flower.harness.tasks.models and dq_flower.model_ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dq_flower.harness.tasks.models import MODEL_NAMES, make_model
from dq_flower.model_ops import (
    evaluate,
    flat_grad,
    from_arrays,
    get_flat,
    loss_and_grad,
    num_params,
    set_flat,
    to_arrays,
)

CASES = [
    ("logreg", (1, 8, 8), 4),
    ("logreg", (5,), 4),
    ("mlp", (1, 8, 8), 4),
    ("mlp", (5,), 3),
    ("cnn", (1, 28, 28), 4),
    ("cnn", (3, 32, 32), 4),
    ("wide-cnn", (1, 28, 28), 4),
    ("cnn1d", (6, 128), 4),
    ("cnn1d", (3, 8), 2),
    ("resnet20", (3, 32, 32), 2),
    ("resnet18", (3, 32, 32), 2),
]


def test_model_names():
    assert set(MODEL_NAMES) == {"logreg", "mlp", "cnn", "wide-cnn", "cnn1d", "resnet20",
                                "resnet18", "char-transformer"}
    with pytest.raises(ValueError, match="logreg.*resnet18"):
        make_model("vgg", (3, 32, 32), 10)


@pytest.mark.parametrize(("name", "shape", "batch"), CASES)
def test_forward_on_flat_input(name, shape, batch):
    model = make_model(name, shape, num_classes=7)
    x = torch.rand(batch, int(np.prod(shape)))
    model.eval()
    with torch.no_grad():
        out = model(x)
    assert out.shape == (batch, 7)
    assert torch.isfinite(out).all()


def test_image_models_reject_tabular_shapes():
    for name in ("cnn", "wide-cnn", "resnet20", "resnet18"):
        with pytest.raises(ValueError, match="image"):
            make_model(name, (20,), 3)


def test_cnn1d_convolves_over_time_and_wants_channels_by_time():
    convs = [m for m in make_model("cnn1d", (6, 128), 6).modules()
             if isinstance(m, torch.nn.Conv1d)]
    assert [c.in_channels for c in convs] == [6, 32, 64] and len(convs) == 3
    for shape in ((768,), (1, 6, 128), (6, 3)):
        with pytest.raises(ValueError, match="sensor windows"):
            make_model("cnn1d", shape, 6)


def test_parameter_counts():
    assert num_params(make_model("logreg", (1, 28, 28), 10)) == 784 * 10 + 10
    assert num_params(make_model("mlp", (1, 28, 28), 10)) == 784 * 128 + 128 + 1290
    assert num_params(make_model("mlp", (64,), 10, hidden=(32, 16))) == (
        64 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10)
    assert num_params(make_model("cnn", (1, 28, 28), 10)) == 28_938
    assert num_params(make_model("cnn1d", (6, 128), 6)) == 32_230
    wide = num_params(make_model("wide-cnn", (1, 28, 28), 10))
    assert 600_000 <= wide <= 1_000_000 and wide == 857_738
    r20 = num_params(make_model("resnet20", (3, 32, 32), 10))
    assert 260_000 <= r20 <= 280_000  # "0.27M" in He et al. (2016)
    r18 = num_params(make_model("resnet18", (3, 32, 32), 10))
    assert 11_000_000 <= r18 <= 11_300_000


def test_resnet18_has_cifar_stem():
    body = make_model("resnet18", (3, 32, 32), 10).body
    assert body.conv1.kernel_size == (3, 3) and body.conv1.stride == (1, 1)
    assert isinstance(body.maxpool, torch.nn.Identity)


def test_seeded_init_leaves_global_rng_alone():
    a = get_flat(make_model("cnn", (1, 28, 28), 10, seed=1))
    b = get_flat(make_model("cnn", (1, 28, 28), 10, seed=1))
    c = get_flat(make_model("cnn", (1, 28, 28), 10, seed=2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_model("mlp", (8,), 2, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_get_set_flat_round_trip():
    model = make_model("cnn", (1, 28, 28), 10)
    vec = get_flat(model)
    assert vec.dtype == np.float32 and vec.shape == (num_params(model),)
    new = np.random.default_rng(0).standard_normal(vec.shape).astype(np.float32)
    set_flat(model, new)
    np.testing.assert_array_equal(get_flat(model), new)
    # order is named_parameters order
    first = next(iter(model.named_parameters()))[1]
    np.testing.assert_array_equal(first.detach().numpy().ravel(), new[: first.numel()])
    with pytest.raises(ValueError, match="shape"):
        set_flat(model, new[:-1])
    with pytest.raises(ValueError, match="shape"):
        set_flat(model, new.reshape(1, -1))


def _logreg_case(n: int = 6, d: int = 5, c: int = 3):
    rng = np.random.default_rng(0)
    x = rng.random((n, d), dtype=np.float32)
    y = np.array([0, 2, 1, 1, 0, 2][:n])
    model = make_model("logreg", (d,), c, seed=0)
    w = model[1].weight.detach().numpy().astype(np.float64)
    b = model[1].bias.detach().numpy().astype(np.float64)
    logits = x @ w.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    onehot = np.eye(c)[y]
    loss = float(-np.log(p[np.arange(n), y]).mean())
    grad = np.concatenate([((p - onehot).T @ x / n).ravel(), (p - onehot).mean(0)])
    return model, x, y, loss, grad


def test_flat_grad_matches_hand_computed_logreg():
    model, x, y, _, grad = _logreg_case()
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    np.testing.assert_allclose(flat_grad(model), grad, rtol=1e-5, atol=1e-6)


def test_loss_and_grad_matches_hand_computation_and_keeps_grad_fields():
    model, x, y, loss, grad = _logreg_case()
    value, g = loss_and_grad(model, x, y)
    assert value == pytest.approx(loss, rel=1e-5)
    np.testing.assert_allclose(g, grad, rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in model.parameters())
    total, gs = loss_and_grad(model, x, y, reduction="sum")
    assert total == pytest.approx(len(y) * loss, rel=1e-5)
    np.testing.assert_allclose(gs, len(y) * grad, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="reduction"):
        loss_and_grad(model, x, y, reduction="max")


def test_evaluate_accuracy_and_loss():
    model = make_model("logreg", (4,), 4)
    with torch.no_grad():
        model[1].weight.copy_(10 * torch.eye(4))
        model[1].bias.zero_()
    x = np.tile(np.eye(4, dtype=np.float32), (5, 1))
    y = np.tile(np.arange(4), 5)
    model.train()
    loss, acc = evaluate(model, x, y, batch_size=3)
    assert acc == 1.0 and model.training
    expected = -np.log(np.exp(10) / (np.exp(10) + 3))
    assert loss == pytest.approx(expected, abs=1e-6)
    loss2, acc2 = evaluate(model, x, (y + 1) % 4, batch_size=1024)
    assert acc2 == 0.0 and loss2 > loss
    with pytest.raises(ValueError):
        evaluate(model, x[:0], y[:0])


def test_array_record_round_trip_with_batchnorm_buffers():
    src = make_model("resnet20", (3, 32, 32), 10, seed=0)
    src.train()
    with torch.no_grad():
        src(torch.rand(4, 3072))  # moves BatchNorm running statistics
    record = to_arrays(src)
    assert "body.bn1.running_mean" in record
    dst = make_model("resnet20", (3, 32, 32), 10, seed=1)
    from_arrays(dst, record)
    for (k, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    with pytest.raises(RuntimeError):
        from_arrays(make_model("cnn", (3, 32, 32), 10), record)
