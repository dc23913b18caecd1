"""Local dataset loaders for the examples. Nothing here downloads anything.

* :func:`load_digits_split` -- scikit-learn's bundled 8x8 digits, scaled to
  [0, 1], with a fixed stratified split so every trial sees the same data.
* :func:`load_mnist` -- MNIST-format data (MNIST, Fashion-MNIST) from IDX
  files or a keras-style ``mnist.npz``; the path comes from the argument or
  the environment variable ``HPO_MNIST_PATH``, else Debian's
  ``dataset-fashion-mnist`` where it is installed.
* :func:`load_cifar10` -- CIFAR-10 from the python-version
  ``cifar-10-batches-py`` directory or an ``.npz``; the path comes from the
  argument or ``HPO_CIFAR10_PATH``.

Loaded arrays are cached per process (keyed by path and modification time)
and returned read-only: copy them before writing. Compute nodes of a cluster
usually have no internet; put the data on shared storage once.
"""

from __future__ import annotations

import functools
import gzip
import os
import pickle
from pathlib import Path

import numpy as np

__all__ = [
    "MNIST_ENV",
    "MNIST_FILES",
    "CIFAR10_ENV",
    "load_digits_split",
    "load_mnist",
    "load_cifar10",
    "locate_mnist",
    "locate_cifar10",
    "read_idx_images",
    "read_idx_labels",
    "subsample",
]

MNIST_ENV = "HPO_MNIST_PATH"
CIFAR10_ENV = "HPO_CIFAR10_PATH"
MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
#: Where to look when neither the config nor the environment names the data:
#: Debian's ``dataset-fashion-mnist`` package installs Fashion-MNIST here.
MNIST_DEFAULT_DIRS = (Path("/usr/share/datasets/fashion-mnist"),)
CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)

_IDX_IMAGES_MAGIC = 2051
_IDX_LABELS_MAGIC = 2049

Split = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


# --------------------------------------------------------------------- digits


@functools.lru_cache(maxsize=4)
def load_digits_split(test_size: float = 0.2, seed: int = 0) -> Split:
    """Return ``(x_train, y_train), (x_val, y_val)`` of scikit-learn's digits.

    ``x`` is float32 of shape (N, 64) in [0, 1]; ``y`` is int32. The split is
    stratified and fixed by ``seed``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    x_tr, x_va, y_tr, y_va = train_test_split(
        x, y, test_size=test_size, stratify=y, random_state=seed
    )
    return _readonly((x_tr, y_tr), (x_va, y_va))


# ---------------------------------------------------------------------- MNIST


def _open_maybe_gzip(path: Path):
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def _read_idx(path: Path, magic: int, header_ints: int) -> tuple[tuple[int, ...], bytes]:
    path = Path(path)
    with _open_maybe_gzip(path) as f:
        raw = f.read()
    header_len = 4 * header_ints
    if len(raw) < header_len:
        raise ValueError(f"{path}: not an IDX file (only {len(raw)} bytes, header needs {header_len})")
    header = np.frombuffer(raw[:header_len], dtype=">u4")
    if int(header[0]) != magic:
        kind = "image" if magic == _IDX_IMAGES_MAGIC else "label"
        raise ValueError(
            f"{path}: bad magic number {int(header[0])} for an IDX {kind} file "
            f"(expected {magic}); is this the right file, and is it a complete download?"
        )
    dims = tuple(int(d) for d in header[1:])
    expected = int(np.prod(dims))
    payload = raw[header_len:]
    if len(payload) != expected:
        raise ValueError(
            f"{path}: the header announces {'x'.join(map(str, dims))} = {expected} bytes "
            f"of data but the file holds {len(payload)} (truncated or corrupt)"
        )
    return dims, payload


def read_idx_images(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX image file (gzipped or not) into uint8 of shape (N, rows, cols)."""
    dims, payload = _read_idx(Path(path), _IDX_IMAGES_MAGIC, 4)
    return np.frombuffer(payload, dtype=np.uint8).reshape(dims)


def read_idx_labels(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX label file (gzipped or not) into uint8 of shape (N,)."""
    dims, payload = _read_idx(Path(path), _IDX_LABELS_MAGIC, 2)
    return np.frombuffer(payload, dtype=np.uint8).reshape(dims)


def _mnist_help(where: str) -> str:
    files = ", ".join(MNIST_FILES)
    return (
        f"MNIST-format data not found: {where}. Expected a directory holding {files} "
        f"(the same names without .gz are accepted too), or a keras-style mnist.npz "
        f"with x_train, y_train, x_test, y_test. Nothing is downloaded at run time: "
        f"download the four files from the MNIST site (or Fashion-MNIST's) on a machine "
        f"with internet and copy them here, or on Debian `apt-get install "
        f"dataset-fashion-mnist` gives /usr/share/datasets/fashion-mnist; then set "
        f'{MNIST_ENV} or "data_path" in the config.'
    )


def _resolve(path: str | os.PathLike | None, env: str, help_fn,
             defaults: tuple[Path, ...] = ()) -> Path:
    if path is None or str(path) == "":
        path = os.environ.get(env) or None
        if path is None:
            found = next((d for d in defaults if d.is_dir()), None)
            if found is not None:
                return found.resolve()
            raise FileNotFoundError(
                help_fn(f'no path given (config "data_path" is unset and so is ${env})')
            )
        source = f"${env}"
    else:
        source = '"data_path"'
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise FileNotFoundError(help_fn(f"{resolved} (from {source}) does not exist"))
    return resolved.resolve()


def _fingerprint(path: Path, depth: int = 1) -> tuple:
    """Names, sizes and mtimes of the files in ``path`` (and its ``cifar-10-batches-py``): a cache key."""
    st = path.stat()
    if not path.is_dir():
        return (st.st_size, st.st_mtime_ns)
    entries: list[tuple[object, ...]] = []
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.is_dir() and depth > 0 and entry.name == CIFAR10_DIR:
            entries.append((entry.name, _fingerprint(Path(entry.path), depth - 1)))
        elif entry.is_file():
            est = entry.stat()
            entries.append((entry.name, est.st_size, est.st_mtime_ns))
    return tuple(entries)


def _find_mnist_file(directory: Path, name: str) -> Path | None:
    for candidate in (directory / name, directory / name.removesuffix(".gz")):
        if candidate.is_file():
            return candidate
    return None


def load_mnist(path: str | os.PathLike | None = None) -> Split:
    """Return ``(x_train, y_train), (x_test, y_test)`` of MNIST-format data.

    ``path`` (or ``$HPO_MNIST_PATH`` when it is ``None``) is a directory of the
    four IDX files, gzipped or not, or an ``.npz`` with ``x_train``, ``y_train``,
    ``x_test``, ``y_test`` (keras's ``mnist.npz`` layout). Images are uint8 of
    shape (N, 28, 28), labels uint8 of shape (N,). Raises
    :class:`FileNotFoundError` saying where it looked and how to get the data,
    and :class:`ValueError` for a file that is not what it should be.
    """
    resolved = locate_mnist(path)
    return _load_mnist_cached(str(resolved), _fingerprint(resolved))


def locate_mnist(path: str | os.PathLike | None = None) -> Path:
    """Where :func:`load_mnist` would read, checked without reading it: the
    directory holding the four files (or an ``mnist.npz``), or the ``.npz``.
    Raises :class:`FileNotFoundError` as :func:`load_mnist` does."""
    resolved = _resolve(path, MNIST_ENV, _mnist_help, MNIST_DEFAULT_DIRS)
    if resolved.is_dir():
        missing = [name for name in MNIST_FILES if _find_mnist_file(resolved, name) is None]
        if missing and not (resolved / "mnist.npz").is_file():
            raise FileNotFoundError(
                _mnist_help(f"{resolved} lacks {', '.join(missing)} (or the same without .gz)"))
    return resolved


@functools.lru_cache(maxsize=2)
def _load_mnist_cached(path: str, _key: tuple) -> Split:
    p = Path(path)
    if p.is_dir():
        looked = {name: _find_mnist_file(p, name) for name in MNIST_FILES}
        found = {name: f for name, f in looked.items() if f is not None}
        if len(found) < len(looked):  # locate_mnist found the .npz
            return _load_npz(p / "mnist.npz", image_ndim=3)
        x_tr = read_idx_images(found[MNIST_FILES[0]])
        y_tr = read_idx_labels(found[MNIST_FILES[1]])
        x_te = read_idx_images(found[MNIST_FILES[2]])
        y_te = read_idx_labels(found[MNIST_FILES[3]])
        for split, x, y in (("train", x_tr, y_tr), ("t10k", x_te, y_te)):
            if len(x) != len(y):
                raise ValueError(f"{p}: {split} has {len(x)} images but {len(y)} labels")
        return _readonly((x_tr, y_tr), (x_te, y_te))
    return _load_npz(p, image_ndim=3)


def _load_npz(path: Path, image_ndim: int) -> Split:
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in data]
            if missing:
                raise ValueError(
                    f"{path}: the .npz lacks {', '.join(missing)} "
                    f"(expected x_train, y_train, x_test, y_test)"
                )
            arrays = {k: data[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except (OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npz file ({exc})") from exc
    out = []
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"].reshape(-1)
        if x.ndim != image_ndim:
            raise ValueError(f"{path}: x_{split} has shape {x.shape}, expected {image_ndim} dimensions")
        if len(x) != len(y):
            raise ValueError(f"{path}: x_{split} has {len(x)} images but y_{split} {len(y)} labels")
        out.append((x, y))
    return _readonly(*out)


# ------------------------------------------------------------------- CIFAR-10


def _cifar_help(where: str) -> str:
    return (
        f"CIFAR-10 data not found: {where}. Expected the python-version directory "
        f"{CIFAR10_DIR} (holding {', '.join(CIFAR10_FILES)}), a directory that contains it, "
        f"or an .npz with x_train (N, 32, 32, 3), y_train, x_test, y_test. Nothing is "
        f"downloaded at run time: download 'CIFAR-10 python version' "
        f"(cifar-10-python.tar.gz) from https://www.cs.toronto.edu/~kriz/cifar.html on a "
        f"machine with internet, unpack it here; then set {CIFAR10_ENV} or \"data_path\" "
        f"in the config."
    )


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    # The official files are pickles: only point data_path at files you trust.
    with open(path, "rb") as f:
        try:
            batch = pickle.load(f, encoding="bytes")
        except Exception as exc:  # any unpickling failure means "not a batch"
            raise ValueError(f"{path}: not a CIFAR-10 python batch ({exc})") from exc
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: not a CIFAR-10 python batch (a {type(batch).__name__}, not a dict)")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise ValueError(f"{path}: a CIFAR-10 batch needs the keys b'data' and b'labels'")
    data = np.asarray(data, dtype=np.uint8)
    labels = np.asarray(labels, dtype=np.uint8).reshape(-1)
    if data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"{path}: data has shape {data.shape}, expected (N, 3072)")
    if len(data) != len(labels):
        raise ValueError(f"{path}: {len(data)} images but {len(labels)} labels")
    # Rows are three 32x32 planes (R, G, B): go to channels-last.
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def load_cifar10(path: str | os.PathLike | None = None) -> Split:
    """Return ``(x_train, y_train), (x_test, y_test)`` of CIFAR-10.

    ``path`` (or ``$HPO_CIFAR10_PATH`` when it is ``None``) is the
    ``cifar-10-batches-py`` directory (pickles ``data_batch_1`` .. ``_5`` and
    ``test_batch``), a directory containing it, or an ``.npz`` with
    ``x_train`` (N, 32, 32, 3), ``y_train``, ``x_test``, ``y_test``. Images are
    uint8 of shape (N, 32, 32, 3), labels uint8 of shape (N,).
    """
    resolved = locate_cifar10(path)
    return _load_cifar_cached(str(resolved), _fingerprint(resolved))


def locate_cifar10(path: str | os.PathLike | None = None) -> Path:
    """Where :func:`load_cifar10` would read, checked without reading it.
    Raises :class:`FileNotFoundError` as :func:`load_cifar10` does."""
    resolved = _resolve(path, CIFAR10_ENV, _cifar_help)
    if resolved.is_dir():
        batches = resolved / CIFAR10_DIR if (resolved / CIFAR10_DIR).is_dir() else resolved
        missing = [name for name in CIFAR10_FILES if not (batches / name).is_file()]
        if missing:
            raise FileNotFoundError(_cifar_help(f"{batches} lacks {', '.join(missing)}"))
    return resolved


@functools.lru_cache(maxsize=2)
def _load_cifar_cached(path: str, _key: tuple) -> Split:
    p = Path(path)
    if not p.is_dir():
        (x_tr, y_tr), (x_te, y_te) = _load_npz(p, image_ndim=4)
        if x_tr.shape[1:] != (32, 32, 3) or x_te.shape[1:] != (32, 32, 3):
            raise ValueError(
                f"{p}: images have shapes {x_tr.shape} and {x_te.shape}, expected (N, 32, 32, 3)"
            )
        return (x_tr, y_tr), (x_te, y_te)
    if not (p / "test_batch").is_file() and (p / CIFAR10_DIR).is_dir():
        p = p / CIFAR10_DIR
    missing = [name for name in CIFAR10_FILES if not (p / name).is_file()]
    if missing:
        raise FileNotFoundError(_cifar_help(f"{p} lacks {', '.join(missing)}"))
    train = [_read_cifar_batch(p / name) for name in CIFAR10_FILES[:-1]]
    x_tr = np.concatenate([x for x, _ in train])
    y_tr = np.concatenate([y for _, y in train])
    x_te, y_te = _read_cifar_batch(p / "test_batch")
    return _readonly((x_tr, y_tr), (x_te, y_te))


# -------------------------------------------------------------------- helpers


def subsample(
    x: np.ndarray, y: np.ndarray, n: int | None, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``n`` random rows of ``(x, y)`` (fixed by ``seed``); all when ``n`` is None or >= N."""
    if n is None or int(n) >= len(x):
        return x, y
    n = int(n)
    if n < 1:
        raise ValueError(f"max_train_samples must be at least 1, got {n}")
    index = np.sort(np.random.default_rng(seed).permutation(len(x))[:n])
    return x[index], y[index]


def _readonly(*pairs: tuple[np.ndarray, np.ndarray]) -> Split:
    for pair in pairs:
        for array in pair:
            array.flags.writeable = False
    return tuple(pairs)  # type: ignore[return-value]  # two pairs from every caller: a Split
