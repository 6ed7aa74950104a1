"""Models: the paper's CNNs and small ones for tests, built by name (``cnn``, ``lstm``), with the engine's key-driven
dropout (``dropout``), weighted BatchNorm (``batchnorm``) and their cost (``flops``). It may import ``core`` only."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import os
import sys
from typing import Callable, Iterator

import torch
from torch import nn

from fedsl.models.cnn import Classifier, cifar_cnn, emnist_cnn, logreg, mlp, small_cnn
from fedsl.models.dropout import KeyedDropout, replace_dropout
from fedsl.models.lstm import CharLSTM, char_lstm, char_lstm_small

MODELS: dict[str, Callable[..., nn.Module]] = {
    "emnist_cnn": emnist_cnn,
    "cifar_cnn": cifar_cnn,
    "small_cnn": small_cnn,
    "mlp": mlp,
    "linear": lambda num_classes, in_features: mlp(num_classes, in_features, hidden=0),
    "logreg": logreg,
    "char_lstm": char_lstm,
    "char_lstm_small": char_lstm_small,
}
TEXT_MODELS = ("char_lstm", "char_lstm_small")  # inputs: character indices [L] (text datasets: shakespeare)


# An imported factory ('package.module:factory') is code that runs: a config (or a results folder
# handed to `fedsl resume`) cannot opt itself in, so the person running fedsl does, in the environment.
ALLOW_IMPORT_ENV = "FEDSL_ALLOW_IMPORT"
# never model factories, whatever the environment says (not a sandbox: the opt-in is the gate)
DENIED_MODULES = frozenset({"os", "sys", "subprocess", "shutil", "builtins", "importlib", "pty", "socket", "posix",
                            "nt", "ctypes", "runpy", "code", "pickle", "marshal", "multiprocessing", "signal",
                            "pathlib", "io", "tempfile", "urllib", "http", "webbrowser"})


def imports_allowed() -> bool:
    return os.environ.get(ALLOW_IMPORT_ENV, "").strip().lower() in ("1", "true", "yes")


def import_problem(path: str) -> str | None:
    """Why the model import path ``path`` may not be imported (None when it may)."""
    top = path.partition(":")[0].split(".")[0]
    if top in DENIED_MODULES or top.startswith("_"):
        return (f"model.name = {path!r}: module {top!r} is never imported as a model; expected "
                "'package.module:factory', a factory(num_classes, input_shape) returning a torch.nn.Module")
    if not imports_allowed():
        return (f"model.name = {path!r} imports and runs Python code: set {ALLOW_IMPORT_ENV}=1 in the environment "
                "to allow imported model factories (only for code you trust), or use a built-in model: "
                + ", ".join(MODELS))
    return None


@contextlib.contextmanager
def _first_on_path(folder: str | None) -> Iterator[None]:
    """``folder`` first on ``sys.path`` for the block, so that a module beside a config wins over one of the same
    name elsewhere; afterwards at the path's end, where it shadows no other module but lets a process that
    unpickles the model (the 'processes' executor's workers, spawned with this path) import its module."""
    if folder is None:
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)  # the first occurrence: the one inserted above
        if folder not in sys.path:
            sys.path.append(folder)


def _import_factory(path: str, import_dir: str | None = None) -> Callable[..., nn.Module]:
    """The factory at ``path``, checked to be callable as factory(num_classes=..., input_shape=...), its module
    looked for in ``import_dir`` first (``model.import_dir``: the config's folder)."""
    if problem := import_problem(path):
        raise ValueError(problem)
    if import_dir is not None and not os.path.isdir(import_dir):
        raise ValueError(f"model.import_dir = {import_dir!r} is not a folder: expected the folder of {path!r}'s "
                         "module (by default the config file's own)")
    module_name, _, attr = path.partition(":")
    expected = "expected 'package.module:factory', a factory(num_classes, input_shape) returning a torch.nn.Module"
    where = f"in {import_dir!r} or " if import_dir is not None else ""
    try:
        with _first_on_path(import_dir):
            factory = getattr(importlib.import_module(module_name), attr)
    except Exception as e:  # noqa: BLE001 — ImportError, AttributeError or the module's own error: one line
        raise ValueError(f"model.name = {path!r}: cannot import it ({type(e).__name__}: {e}); {expected} "
                         f"{where}on the Python path") from None
    if not callable(factory):
        raise ValueError(f"model.name = {path!r} is a {type(factory).__name__}, not callable: {expected}")
    try:
        inspect.signature(factory).bind(num_classes=1, input_shape=(1,))
    except TypeError:
        raise ValueError(f"model.name = {path!r} does not take the arguments num_classes and input_shape: "
                         f"{expected}") from None
    except ValueError:  # no signature to inspect (some built-in functions)
        raise ValueError(f"model.name = {path!r} has no inspectable signature: {expected}") from None
    return factory


INITS = ("auto", "keras", "torch")


def keras_init_(model: nn.Module) -> nn.Module:
    """Re-initialise ``model`` as Keras does (in place, from torch's global generator).

    Every Conv and Linear kernel is Glorot-uniform, U(-a, a) with a = √(6 / (fan_in + fan_out)),
    where Keras takes fan_in = kh·kw·in_channels and fan_out = kh·kw·out_channels for a
    Conv2D (a Dense: its input and output sizes); every bias is zero. The paper's models are
    Keras models (its appendix tables are Keras summaries), so this is their initialisation.
    """
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
            w = module.weight
            receptive = math.prod(w.shape[2:])  # kh·kw (1 for Dense)
            fan_in, fan_out = w.shape[1] * receptive, w.shape[0] * receptive
            limit = math.sqrt(6.0 / (fan_in + fan_out))
            with torch.no_grad():
                w.uniform_(-limit, limit)
                if module.bias is not None:
                    module.bias.zero_()
    return model


def build_model(name: str, num_classes: int, input_shape: tuple[int, ...], seed: int,
                init: str = "auto", import_dir: str | None = None) -> nn.Module:
    """Build model ``name`` for inputs of ``input_shape`` (C, H, W), initialised from ``seed``.

    ``name`` is a built-in model or ``'package.module:factory'``, a callable taking
    ``(num_classes, input_shape)`` and returning any ``torch.nn.Module`` (BatchNorm: ``fedsl.models.batchnorm``).
    ``init``: ``'keras'`` (Glorot-uniform kernels, zero biases: the paper's Keras models,
    ``keras_init_``), ``'torch'`` (PyTorch's layer defaults, as the constructor leaves them)
    or ``'auto'`` (keras for the built-in models, the factory's own for an imported one).
    ``import_dir``: the folder an imported factory's module is looked for in first (``model.import_dir``).
    """
    if init not in INITS:
        raise ValueError(f"model.init = {init!r}: expected one of {', '.join(INITS)}")
    if ":" in name:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            factory = _import_factory(name, import_dir)
            try:
                model = factory(num_classes=num_classes, input_shape=tuple(input_shape))
            except Exception as e:  # noqa: BLE001 — the factory's own error, as one line
                raise ValueError(f"model.name = {name!r}: the factory failed ({type(e).__name__}: {e})") from None
            if not isinstance(model, nn.Module):
                raise ValueError(f"model.name = {name!r} returned {type(model).__name__}: expected a torch.nn.Module")
            if init == "keras":
                keras_init_(model)
        return model
    if name not in MODELS:
        raise ValueError(f"model.name = {name!r}: expected one of {sorted(MODELS)}")
    c = input_shape[0]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name in ("mlp", "linear", "logreg"):
            model = MODELS[name](num_classes=num_classes, in_features=math.prod(input_shape))
        elif name in TEXT_MODELS:
            if len(input_shape) != 1:
                raise ValueError(f"model.name = {name!r} reads text (character indices [L]), but the dataset gives "
                                 f"inputs of shape {tuple(input_shape)}: expected a text dataset (shakespeare, LEAF's "
                                 "Shakespeare JSON)")
            model = MODELS[name](num_classes=num_classes)
        elif name == "small_cnn":
            if len(input_shape) != 3:
                raise ValueError(f"model.name = 'small_cnn' reads images (C, H, W), but the dataset gives inputs of "
                                 f"shape {tuple(input_shape)}: expected mlp, linear or logreg for features, or "
                                 "features shaped [n, C, H, W]")
            model = small_cnn(num_classes=num_classes, in_channels=c, image_size=input_shape[-1])
        else:
            expected = (1, 28, 28) if name == "emnist_cnn" else (3, 32, 32)
            if tuple(input_shape) != expected:
                raise ValueError(
                    f"model.name = {name!r} expects inputs of shape {expected} (C, H, W), "
                    f"but the dataset gives {tuple(input_shape)}"
                )
            model = MODELS[name](num_classes=num_classes)
        if init != "torch":
            # after construction, from the same seeded stream: init = 'torch' is today's model
            keras_init_(model)
    return model


def has_representation(model: nn.Module) -> bool:
    """Whether ``model`` exposes its representation z: methods ``features(x) -> z`` and ``head(z) -> logits``
    with ``forward(x) = head(features(x))`` (the built-in models but ``linear``: ``cnn.Classifier``).
    Submodules that happen to be named ``features`` or ``head`` (torchvision's VGG) do not count."""
    return all(inspect.ismethod(getattr(model, m, None)) for m in ("features", "head"))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["MODELS", "INITS", "ALLOW_IMPORT_ENV", "DENIED_MODULES", "import_problem", "build_model", "keras_init_",
           "count_parameters", "emnist_cnn", "cifar_cnn", "small_cnn", "mlp", "logreg", "KeyedDropout",
           "replace_dropout", "Classifier", "has_representation", "CharLSTM", "char_lstm", "char_lstm_small",
           "TEXT_MODELS"]
