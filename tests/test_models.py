import pytest
import torch
from torch import nn

from fedsl.engine.functional import FunctionalModel
from fedsl.models import build_model, count_parameters
from fedsl.models.dropout import KeyedDropout, keyed_uniform, replace_dropout


def test_emnist_cnn_matches_paper_table():
    m = build_model("emnist_cnn", 45, (1, 28, 28), seed=0)
    assert count_parameters(m) == 1_409_197
    assert m(torch.zeros(3, 1, 28, 28)).shape == (3, 45)
    # layer sizes of the table: 320, 18,496, 1,384,576, 5,805
    assert [p.numel() for p in m.parameters()] == [288, 32, 18432, 64, 1384448, 128, 5760, 45]


def test_cifar_cnn_matches_paper_table():
    m = build_model("cifar_cnn", 10, (3, 32, 32), seed=0)
    assert count_parameters(m) == 545_098
    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("name,classes,shape", [("cifar_cnn", 10, (3, 32, 32)), ("emnist_cnn", 45, (1, 28, 28))])
def test_pool_before_relu_is_the_paper_order(name, classes, shape):
    """The CNNs pool before the ReLU (faster); outputs and gradients equal the table's
    ReLU-then-pool order, parameter names included."""
    m = build_model(name, classes, shape, seed=0).double()
    layers = list(m)
    table = []
    for i, layer in enumerate(layers):  # swap every (MaxPool, ReLU) pair back to (ReLU, MaxPool)
        if isinstance(layer, nn.ReLU) and i > 0 and isinstance(layers[i - 1], nn.MaxPool2d):
            table[-1], layer = layer, table[-1]
        table.append(layer)
    assert any(isinstance(a, nn.MaxPool2d) for a in layers) and table != layers
    ref = nn.Sequential(*table)
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in m.named_parameters()]
    m.eval()
    ref.eval()
    x = torch.randn(4, *shape, dtype=torch.float64)
    y = torch.randint(0, classes, (4,))
    out, out_ref = m(x), ref(x)
    assert torch.equal(out, out_ref)
    g = torch.autograd.grad(nn.functional.cross_entropy(out, y), list(m.parameters()))
    g_ref = torch.autograd.grad(nn.functional.cross_entropy(out_ref, y), list(ref.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(g, g_ref))


def test_wrong_input_shape_is_a_clear_error():
    with pytest.raises(ValueError, match=r"emnist_cnn.*\(1, 28, 28\).*\(3, 32, 32\)"):
        build_model("emnist_cnn", 10, (3, 32, 32), seed=0)
    with pytest.raises(ValueError, match="model.name = 'resnet'"):
        build_model("resnet", 10, (3, 32, 32), seed=0)


def test_init_depends_on_seed_only():
    a, b, c = (build_model("small_cnn", 10, (1, 28, 28), seed=s) for s in (1, 1, 2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_keyed_dropout_is_a_function_of_key():
    d = KeyedDropout(0.5, salt=1).train()
    x = torch.ones(64, 100)
    d.key = torch.tensor(7)
    y1, y2 = d(x), d(x)
    d.key = torch.tensor(8)
    y3 = d(x)
    assert torch.equal(y1, y2) and not torch.equal(y1, y3)
    kept = (y1 > 0).double().mean().item()
    assert 0.47 < kept < 0.53  # drop rate p
    assert torch.allclose(y1[y1 > 0], torch.full_like(y1[y1 > 0], 2.0))  # inverted scaling 1/(1-p)
    assert torch.equal(d.eval()(x), x)


def test_keyed_uniform_is_uniform_and_layer_salted():
    u = keyed_uniform(torch.tensor(123), 1, torch.Size([100_000]), torch.float64)
    v = keyed_uniform(torch.tensor(123), 2, torch.Size([100_000]), torch.float64)
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    assert abs(torch.corrcoef(torch.stack([u, v]))[0, 1].item()) < 0.02
    # rows of a batch are not copies of each other
    rows = keyed_uniform(torch.tensor(5), 1, torch.Size([2, 1000]), torch.float64)
    assert not torch.equal(rows[0], rows[1])


def test_replace_dropout_in_user_module():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.ReLU())
            self.drop = nn.Dropout(0.1)
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.drop(self.body(x)))

    net = Net()
    names = replace_dropout(net)
    assert names == ["body.1.key", "drop.key"]
    assert isinstance(net.body[1], KeyedDropout) and net.body[1].p == 0.3
    assert net.body[1].salt != net.drop.salt


def test_batchnorm_is_made_a_function_and_stateful_modules_are_refused():
    # BatchNorm, with or without running statistics, becomes WeightedBatchNorm (tests/test_batchnorm.py)
    for track in (True, False):
        fm = FunctionalModel(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4, track_running_stats=track)))
        assert fm.norm_names == ["1"] and fm.tracked_stats is track
        assert not any("running" in n for n, _ in fm.module.named_buffers())

    class WithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x):
            return self.lin(x)

    with pytest.raises(ValueError, match="count"):
        FunctionalModel(WithBuffer())


# --------------------------------------------------------------------------- initialisation (model.init)


def keras_limit(w: torch.Tensor) -> float:
    """Keras's Glorot-uniform bound: fan_in = kh·kw·in, fan_out = kh·kw·out (Dense: in, out)."""
    rf = w[0, 0].numel()
    return (6.0 / (w.shape[1] * rf + w.shape[0] * rf)) ** 0.5


@pytest.mark.parametrize("name,classes,shape", [("cifar_cnn", 10, (3, 32, 32)), ("emnist_cnn", 45, (1, 28, 28)),
                                                ("small_cnn", 10, (1, 28, 28)), ("mlp", 4, (1, 8, 8))])
def test_keras_init_is_glorot_uniform_with_zero_biases(name, classes, shape):
    m = build_model(name, classes, shape, seed=0)  # 'auto' is keras for the built-in models
    layers = [mod for mod in m.modules() if isinstance(mod, (nn.Conv2d, nn.Linear))]
    assert layers
    for layer in layers:
        w, a = layer.weight.detach().double(), keras_limit(layer.weight)
        assert w.abs().max() <= a
        if w.numel() >= 1000:  # U(-a, a): the bound is reached and the variance is a²/3
            assert w.abs().max() > 0.99 * a
            assert abs(w.var().item() / (a * a / 3) - 1) < 0.1
        assert torch.count_nonzero(layer.bias) == 0
    # the paper's CIFAR CNN: conv1 3·3·3 -> 3·3·32: a = √(6/(27+288)); dense 4096 -> 128
    if name == "cifar_cnn":
        assert keras_limit(m[0].weight) == pytest.approx((6 / (27 + 288)) ** 0.5)
        assert keras_limit(m[8].weight) == pytest.approx((6 / (4096 + 128)) ** 0.5)


def test_torch_init_is_the_constructors_and_keras_the_default():
    """init = 'torch' keeps PyTorch's layer defaults: the model fedsl built before model.init existed."""
    torch.manual_seed(4)
    from fedsl.models.cnn import cifar_cnn
    before = cifar_cnn(num_classes=10)
    m = build_model("cifar_cnn", 10, (3, 32, 32), seed=4, init="torch")
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), before.parameters()))
    k = build_model("cifar_cnn", 10, (3, 32, 32), seed=4)
    assert torch.count_nonzero(k[0].bias) == 0 and torch.count_nonzero(m[0].bias) > 0
    assert all(torch.equal(p, q) for p, q in zip(k.parameters(), build_model("cifar_cnn", 10, (3, 32, 32), seed=4,
                                                                            init="keras").parameters()))
    with pytest.raises(ValueError, match="model.init = 'he'"):
        build_model("cifar_cnn", 10, (3, 32, 32), seed=4, init="he")


def test_imported_factory_keeps_its_init_unless_keras_is_asked(monkeypatch):
    monkeypatch.setenv("FEDSL_ALLOW_IMPORT", "1")  # imported factories are code: opted in
    import sys
    import types
    mod = types.ModuleType("fedsl_test_factory")
    mod.make = lambda num_classes, input_shape: nn.Sequential(nn.Flatten(), nn.Linear(4, num_classes))
    sys.modules["fedsl_test_factory"] = mod
    try:
        own = build_model("fedsl_test_factory:make", 3, (1, 2, 2), seed=0)
        assert torch.count_nonzero(own[1].bias) > 0  # auto: the factory's (PyTorch's) init
        keras = build_model("fedsl_test_factory:make", 3, (1, 2, 2), seed=0, init="keras")
        assert torch.count_nonzero(keras[1].bias) == 0
    finally:
        del sys.modules["fedsl_test_factory"]
