"""A small PyTorch CNN for scikit-learn's 8x8 digits, trained by a fleet through the Python
path (``agent.model.torch_model.TorchModel``: torch.func gradients behind the model contract):

    edgegrove agent --model examples/torch_cnn/model.py:factory --dataset digits ...

conv 3x3x16 (same, ReLU) -> max-pool 2 -> conv 3x3x32 (same, ReLU) -> max-pool 2 ->
dense 10 over 2x2x32: 6,090 parameters. Needs torch (``pip install torch``, a CPU wheel).
"""

from __future__ import annotations

from typing import Any

INPUT_SHAPE = (1, 8, 8)  # channels first, as torch's convolutions take them
NUM_CLASSES = 10


def build() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * 2 * 32, NUM_CLASSES))


def factory() -> Any:
    from agent.model.torch_model import TorchModel

    return TorchModel(build, INPUT_SHAPE, NUM_CLASSES, name="digits-torch-cnn")
