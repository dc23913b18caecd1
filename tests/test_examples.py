"""The example objectives and the Keras callback, with real (small) training runs."""

from __future__ import annotations

import gzip
import math
import os
import pickle
import struct
import time
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from hpo.examples import datasets, sklearn_digits, toy  # noqa: E402

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


class FakeTrial:
    """Just the trial contract: records reports; ``stop_after`` reports make should_stop True."""

    def __init__(self, config=None, number=0, stop_after=None, tmp=None):
        self.config = dict(config or {})
        self.number = number
        self.checkpoint_dir = tmp
        self.cpus = 1
        self.gpus: list[str] = []
        self.reports: list[tuple[int, dict[str, float]]] = []
        self.stop_after = stop_after

    def report(self, step: int, **metrics: float) -> None:
        self.reports.append((step, metrics))

    def should_stop(self) -> bool:
        return self.stop_after is not None and len(self.reports) >= self.stop_after

    @property
    def next_step(self) -> int:
        return self.reports[-1][0] + 1 if self.reports else 0


# ----------------------------------------------------------------- toy


def test_toy_objectives():
    t = FakeTrial()
    start = time.monotonic()
    assert toy.sleep({"sleep_s": 0.01, "x": 3}, t) == {"value": 3.0}
    assert time.monotonic() - start >= 0.01

    t = FakeTrial()
    out = toy.quadratic({"x": 1.0, "y": 1.0, "steps": 4}, t)
    assert out == {"value": pytest.approx(-5.0)}
    assert [s for s, _ in t.reports] == [0, 1, 2, 3]
    values = [m["value"] for _, m in t.reports]
    assert values == sorted(values) and values[-1] == pytest.approx(-5.0)
    assert toy.quadratic({"x": 2.0, "y": -1.0}, FakeTrial())["value"] == pytest.approx(0.0)

    t = FakeTrial(stop_after=2)
    out = toy.quadratic({"x": 2.0, "steps": 10}, t)
    assert len(t.reports) == 2 and out["value"] == t.reports[-1][1]["value"]

    assert toy.fail({}, FakeTrial()) == {"value": 1.0}
    with pytest.raises(RuntimeError, match="boom"):
        toy.fail({"fail": True}, FakeTrial(number=7))
    assert math.isnan(toy.nan({}, FakeTrial()))

    start = time.monotonic()
    assert toy.slow({"sleep_s": 0.15}, FakeTrial()) == {"value": 1.0}
    assert time.monotonic() - start >= 0.15
    # Stopped early: an hour's sleep that did not stop would run into the test's timeout.
    assert toy.slow({"sleep_s": 3600}, FakeTrial(stop_after=0)) == {"value": 1.0}


# ------------------------------------------------------------- sklearn


def test_sklearn_digits_learns_and_reports_each_epoch():
    t = FakeTrial()
    out = sklearn_digits.train({"max_epochs": 5, "alpha": 1e-4, "l1_ratio": 0.1, "loss": "hinge"}, t)
    assert out["accuracy"] > 0.8
    assert [s for s, _ in t.reports] == [0, 1, 2, 3, 4]
    for _, metrics in t.reports:
        assert metrics["loss"] == pytest.approx(1 - metrics["accuracy"])
    assert out["accuracy"] == pytest.approx(max(m["accuracy"] for _, m in t.reports))


def test_sklearn_digits_stops_early():
    t = FakeTrial(stop_after=1)
    out = sklearn_digits.train({"max_epochs": 20}, t)
    assert len(t.reports) == 1
    assert out["accuracy"] == t.reports[0][1]["accuracy"]


# ------------------------------------------------------------- loaders


def _write_idx(directory: Path, n_train=20, n_test=10, gz=True, rows=28, cols=28):
    rng = np.random.default_rng(1)
    data = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        x = rng.integers(0, 256, size=(n, rows, cols), dtype=np.uint8)
        y = (np.arange(n) % 10).astype(np.uint8)
        data[split] = (x, y)
        opener = gzip.open if gz else open
        suffix = ".gz" if gz else ""
        with opener(directory / f"{split}-images-idx3-ubyte{suffix}", "wb") as f:
            f.write(struct.pack(">IIII", 2051, n, rows, cols) + x.tobytes())
        with opener(directory / f"{split}-labels-idx1-ubyte{suffix}", "wb") as f:
            f.write(struct.pack(">II", 2049, n) + y.tobytes())
    return data


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx_loader(tmp_path, gz):
    written = _write_idx(tmp_path, gz=gz)
    (x_tr, y_tr), (x_te, y_te) = datasets.load_mnist(tmp_path)
    assert x_tr.shape == (20, 28, 28) and x_te.shape == (10, 28, 28)
    assert x_tr.dtype == np.uint8 and y_tr.dtype == np.uint8
    np.testing.assert_array_equal(x_tr, written["train"][0])
    np.testing.assert_array_equal(y_te, written["t10k"][1])


def test_mnist_npz_loader_and_env(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    arrays = {
        "x_train": rng.integers(0, 256, (12, 28, 28), dtype=np.uint8),
        "y_train": (np.arange(12) % 10).astype(np.uint8),
        "x_test": rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
        "y_test": (np.arange(6) % 10).astype(np.uint8),
    }
    np.savez(tmp_path / "mnist.npz", **arrays)
    monkeypatch.setenv("HPO_MNIST_PATH", str(tmp_path / "mnist.npz"))
    (x_tr, y_tr), (x_te, y_te) = datasets.load_mnist()
    assert x_tr.shape == (12, 28, 28) and y_te.shape == (6,)
    np.testing.assert_array_equal(y_tr, arrays["y_train"])
    np.testing.assert_array_equal(x_te, arrays["x_test"])


def test_mnist_bad_magic_and_truncation(tmp_path):
    _write_idx(tmp_path)
    with gzip.open(tmp_path / "train-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 2051, 20) + bytes(20))
    with pytest.raises(ValueError, match=r"bad magic number 2051.*expected 2049"):
        datasets.load_mnist(tmp_path)
    with gzip.open(tmp_path / "x.gz", "wb") as f:
        f.write(struct.pack(">IIII", 2051, 5, 28, 28) + bytes(100))
    with pytest.raises(ValueError, match="truncated"):
        datasets.read_idx_images(tmp_path / "x.gz")


def test_mnist_found_in_debians_directory_without_a_variable(tmp_path, monkeypatch):
    """Where dataset-fashion-mnist is installed, nothing needs setting."""
    monkeypatch.delenv("HPO_MNIST_PATH", raising=False)
    written = _write_idx(tmp_path)
    monkeypatch.setattr(datasets, "MNIST_DEFAULT_DIRS", (tmp_path / "absent", tmp_path))
    assert datasets.locate_mnist() == tmp_path.resolve()
    (x_tr, _), _ = datasets.load_mnist()
    np.testing.assert_array_equal(x_tr, written["train"][0])
    monkeypatch.setenv("HPO_MNIST_PATH", str(tmp_path / "elsewhere"))  # a variable still wins
    with pytest.raises(FileNotFoundError, match="elsewhere"):
        datasets.locate_mnist()


def test_mnist_missing_path_says_where_and_how(tmp_path, monkeypatch):
    monkeypatch.delenv("HPO_MNIST_PATH", raising=False)
    monkeypatch.setattr(datasets, "MNIST_DEFAULT_DIRS", ())  # as on a machine without the package
    with pytest.raises(FileNotFoundError) as err:
        datasets.load_mnist()
    message = str(err.value)
    assert "HPO_MNIST_PATH" in message and "train-images-idx3-ubyte.gz" in message
    assert "t10k-labels-idx1-ubyte.gz" in message and "dataset-fashion-mnist" in message
    with pytest.raises(FileNotFoundError, match="does not exist") as err:
        datasets.load_mnist(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(err.value)
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "train-images-idx3-ubyte.gz").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="lacks train-labels-idx1-ubyte.gz"):
        datasets.load_mnist(tmp_path / "partial")


def _write_cifar(directory: Path, per_batch=16, n_test=8):
    directory.mkdir(parents=True)
    rng = np.random.default_rng(3)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        n = n_test if name == "test_batch" else per_batch
        batch = {
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"labels": [int(v) for v in rng.integers(0, 10, n)],
        }
        with open(directory / name, "wb") as f:
            pickle.dump(batch, f)
    return directory


def test_cifar_loader(tmp_path):
    root = _write_cifar(tmp_path / "cifar-10-batches-py")
    with open(root / "data_batch_1", "rb") as f:
        first = pickle.load(f)
    for path in (root, tmp_path):  # the directory itself or its parent
        (x_tr, y_tr), (x_te, y_te) = datasets.load_cifar10(path)
        assert x_tr.shape == (80, 32, 32, 3) and x_te.shape == (8, 32, 32, 3)
        assert x_tr.dtype == np.uint8 and y_tr.dtype == np.uint8 and y_tr.shape == (80,)
        # channels-first planes became channels-last: pixel (0, 0) of image 0
        plane = first[b"data"][0]
        assert tuple(x_tr[0, 0, 0]) == (plane[0], plane[1024], plane[2048])
        assert list(y_tr[:16]) == first[b"labels"]


def test_cifar_missing_path(tmp_path, monkeypatch):
    monkeypatch.delenv("HPO_CIFAR10_PATH", raising=False)
    with pytest.raises(FileNotFoundError, match="HPO_CIFAR10_PATH") as err:
        datasets.load_cifar10()
    assert "cifar-10-batches-py" in str(err.value) and "toronto" in str(err.value)
    monkeypatch.setenv("HPO_CIFAR10_PATH", str(tmp_path / "none"))
    with pytest.raises(FileNotFoundError, match="HPO_CIFAR10_PATH"):
        datasets.load_cifar10()


# ---------------------------------------------------------------- keras


def test_keras_digits_trains_and_reports():
    from hpo.examples import keras_digits

    t = FakeTrial()
    out = keras_digits.train({"optimizer": "Adam", "learning_rate": 0.01, "num_epochs": 2}, t)
    assert [s for s, _ in t.reports] == [0, 1]
    assert all("val_accuracy" in m and "val_loss" in m for _, m in t.reports)
    assert out["val_accuracy"] > 0.5 and "val_loss" in out
    assert out["val_accuracy"] == max(m["val_accuracy"] for _, m in t.reports)
    with pytest.raises(ValueError, match="unknown optimizer"):
        keras_digits.train({"optimizer": "adagrad"}, FakeTrial())


def test_hpo_callback_stops_training():
    from hpo.examples import keras_digits

    t = FakeTrial(stop_after=1)
    out = keras_digits.train({"optimizer": "sgd", "learning_rate": 0.1, "num_epochs": 20}, t)
    assert len(t.reports) == 1 and t.reports[0][0] == 0
    assert out["val_accuracy"] == t.reports[0][1]["val_accuracy"]


def test_hpo_callback_skips_non_numeric_and_filters():
    from hpo.keras import HpoCallback

    t = FakeTrial()
    HpoCallback(t).on_epoch_end(3, {"loss": np.float32(0.5), "name": "x", "val_accuracy": 1})
    HpoCallback(t, monitor_prefix="val_").on_epoch_end(4, {"loss": 0.5, "val_loss": 0.25})
    assert t.reports == [(3, {"loss": 0.5, "val_accuracy": 1.0}), (4, {"val_loss": 0.25})]


def test_keras_mnist_mlp_on_fashion_mnist():
    if not (FASHION_MNIST / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("no Fashion-MNIST at /usr/share/datasets/fashion-mnist: apt-get install dataset-fashion-mnist")
    from hpo.examples import keras_mnist

    t = FakeTrial()
    config = {"data_path": str(FASHION_MNIST), "optimizer": "Adam", "num_epochs": 1,
              "batch_size": 64, "max_train_samples": 2000}
    out = keras_mnist.train(config, t)
    assert len(t.reports) == 1
    assert out["val_accuracy"] > 0.5


def test_keras_mnist_cnn_on_generated_idx(tmp_path):
    from hpo.examples import keras_mnist

    _write_idx(tmp_path, n_train=32, n_test=16)
    t = FakeTrial()
    out = keras_mnist.train_cnn({"data_path": str(tmp_path), "num_epochs": 1, "batch_size": 16}, t)
    assert len(t.reports) == 1 and 0.0 <= out["val_accuracy"] <= 1.0


def test_keras_cifar_trains_one_epoch(tmp_path, monkeypatch):
    from hpo.examples import keras_cifar

    _write_cifar(tmp_path / "cifar-10-batches-py")
    monkeypatch.setenv("HPO_CIFAR10_PATH", str(tmp_path))
    t = FakeTrial()
    out = keras_cifar.train({"num_epochs": 1, "batch_size": 32, "max_train_samples": 64}, t)
    assert len(t.reports) == 1
    assert set(out) >= {"val_accuracy", "val_loss"} and 0.0 <= out["val_accuracy"] <= 1.0
