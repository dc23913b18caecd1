"""Example objectives, each ``train(config, trial)``-shaped; none downloads anything.

* :mod:`hpo.examples.keras_digits` -- Keras MLP on scikit-learn's bundled digits (quick start).
* :mod:`hpo.examples.keras_mnist` -- the study's MNIST MLP (``train``) and CNN
  (``train_cnn``); local MNIST-format files via ``data_path`` or ``$HPO_MNIST_PATH``.
* :mod:`hpo.examples.keras_cifar` -- the study's CIFAR-10 CNN; local files via
  ``data_path`` or ``$HPO_CIFAR10_PATH``.
* :mod:`hpo.examples.sklearn_digits` -- ``SGDClassifier`` trained epoch by epoch.
* :mod:`hpo.examples.lcbench` -- LCBench learning curves replayed from a YAHPO Gym
  surrogate (a local data folder; needs onnxruntime), for search-quality benchmarks.
* :mod:`hpo.examples.toy` -- ``sleep``, ``quadratic``, ``fail``, ``nan``, ``slow``
  for tests and benchmarks.
* :mod:`hpo.examples.datasets` -- the local data they load (digits, MNIST-format
  files, CIFAR-10), with errors saying how to get it;
  :mod:`hpo.examples.keras_training` -- the Keras examples' training loop.

Importing this package imports nothing heavy; the Keras modules import Keras.
"""
