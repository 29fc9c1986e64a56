"""Datasets for the examples, as float images in [0, 1] (NumPy; no framework).

- ``digits``: scikit-learn's 8x8 handwritten digits (bundled with scikit-learn, no download),
  1797 images split once with a fixed seed into 1257 train / 180 valid / 360 test.
- ``fashion-mnist``: 28x28 Fashion-MNIST from the Debian package ``dataset-fashion-mnist``
  (IDX files in /usr/share/datasets/fashion-mnist): the standard split, the first 50k training
  images for training, the last 10k for validation, the 10k test images for test.
- any MNIST-format IDX files with ``data_dir`` (``train-images-idx3-ubyte[.gz]``,
  ``t10k-images-idx3-ubyte[.gz]`` and the matching ``*-labels-idx1-ubyte[.gz]``), split as Fashion-MNIST.
- ``load_iris``: scikit-learn's Iris measurements (bundled, no download), for the mixture of Gaussians.
"""

import gzip
import os
from dataclasses import dataclass

import numpy as np

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_INSTALL = "apt-get update && apt-get install -y dataset-fashion-mnist"


class DataNotFound(RuntimeError):
    """The dataset's files are missing; the message says how to get them."""


@dataclass
class Dataset:
    name: str
    image_shape: tuple
    train: np.ndarray  # (n, height * width), float32 in [0, 1]
    valid: np.ndarray
    test: np.ndarray
    train_labels: np.ndarray
    valid_labels: np.ndarray
    test_labels: np.ndarray

    @property
    def dim(self):
        return int(np.prod(self.image_shape))


def load(name="digits", data_dir=None):
    """The dataset ``name`` ("digits" or "fashion-mnist"), or MNIST-format IDX files in ``data_dir``."""
    if data_dir is not None:
        return _load_idx(data_dir, name=os.path.basename(os.path.normpath(data_dir)), install_hint=None)
    if name == "digits":
        return _load_digits()
    if name == "fashion-mnist":
        return _load_idx(FASHION_MNIST_DIR, name="fashion-mnist", install_hint=FASHION_MNIST_INSTALL)
    raise ValueError(f"unknown dataset {name!r}: use 'digits' or 'fashion-mnist', or --data-dir")


def _load_digits():
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.data / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(images))
    train, valid, test = order[:1257], order[1257:1437], order[1437:]
    labels = digits.target
    return Dataset("digits", (8, 8), images[train], images[valid], images[test], labels[train], labels[valid], labels[test])


IRIS_FEATURES = ("sepal length", "sepal width", "petal length", "petal width")


def load_iris():
    """(measurements, species): the 150 flowers' 4 measurements, each standardized to mean 0 and
    standard deviation 1 (float32, (150, 4)), and their species (0, 1, 2)."""
    from sklearn.datasets import load_iris as _load

    iris = _load()
    x = iris.data - iris.data.mean(0)
    return (x / x.std(0)).astype(np.float32), iris.target


def _find(directory, stem):
    for candidate in (stem, stem + ".gz"):
        path = os.path.join(directory, candidate)
        if os.path.exists(path):
            return path
    return None


def _read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[:4], "big")
    if magic >> 8 != 0x08:  # unsigned byte data
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (magic {magic:#x})")
    ndim = magic & 0xFF
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _load_idx(directory, name, install_hint):
    stems = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    paths = [_find(directory, stem) for stem in stems]
    missing = [stem for stem, path in zip(stems, paths) if path is None]
    if missing:
        hint = f"; install them with: {install_hint}" if install_hint else ""
        raise DataNotFound(f"{name}: {', '.join(missing)}[.gz] not found in {directory}{hint}")
    train_images, train_labels, test_images, test_labels = (_read_idx(p) for p in paths)
    height, width = train_images.shape[1:]
    train_images = train_images.reshape(len(train_images), -1).astype(np.float32) / 255.0
    test_images = test_images.reshape(len(test_images), -1).astype(np.float32) / 255.0
    cut = len(train_images) - 10000
    return Dataset(
        name,
        (height, width),
        train_images[:cut],
        train_images[cut:],
        test_images,
        train_labels[:cut],
        train_labels[cut:],
        test_labels,
    )


def fixed_binarization(images, mode, seed=1234):
    """A binarized copy for evaluation: one Bernoulli(x) draw with a fixed seed ("dynamic"), or
    x > 1/2 ("threshold")."""
    if mode == "threshold":
        return (images > 0.5).astype(np.float32)
    return (np.random.default_rng(seed).random(images.shape) < images).astype(np.float32)


def batch_indices(num_examples, batch_size, seed, step):
    """The training indices of step ``step``: epochs are seeded permutations, so that a resumed run
    draws the same batches as an uninterrupted one (the last incomplete batch of an epoch is dropped,
    which keeps shapes fixed for compiled steps)."""
    per_epoch = num_examples // batch_size
    if per_epoch < 1:
        raise ValueError(f"batch size {batch_size} exceeds the {num_examples} training examples")
    epoch, position = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num_examples)
    return order[position * batch_size : (position + 1) * batch_size]


class Batches:
    """``batch_indices(num_examples, batch_size, seed, step)`` for step after step, each epoch's
    permutation made once: ``batch_indices`` makes it again at every call, 0.9 ms on 50 000 images,
    more than a compiled step takes on a GPU. ``place`` puts the permutation where the data are,
    once per epoch (``torch.as_tensor(order, device=...)``): a step's indices, ``batches(step)``,
    are then a slice of it there, and its batch ``train[batches(step)]`` is chosen on the device."""

    def __init__(self, num_examples, batch_size, seed, place=None):
        self.per_epoch = num_examples // batch_size
        if self.per_epoch < 1:
            raise ValueError(f"batch size {batch_size} exceeds the {num_examples} training examples")
        self.num_examples, self.batch_size, self.seed = num_examples, batch_size, seed
        self.place = place or (lambda order: order)
        self._epoch, self._order = None, None

    def order(self, epoch):
        """The permutation of epoch ``epoch`` (as ``batch_indices`` draws it), placed."""
        if epoch != self._epoch:
            self._epoch, self._order = epoch, self.place(np.random.default_rng([self.seed, epoch]).permutation(self.num_examples))
        return self._order

    def __call__(self, step):
        epoch, position = divmod(step, self.per_epoch)
        return self.order(epoch)[position * self.batch_size : (position + 1) * self.batch_size]

    def block(self, first, count):
        """The indices of the ``count`` steps from ``first``, one row per step (a NumPy array, for
        ``Batches`` without ``place``): a compiled loop over the steps picks its batches from them."""
        return np.stack([self(step) for step in range(first, first + count)])
