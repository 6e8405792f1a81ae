"""An image folder (one subfolder per class, PNG files) from MNIST's training images, for the
MobileNetV2 runs: ``python examples/mobilenet_v2/make_folder.py OUT --per-class 1000``.
The digits are written as they are (28x28 grey); the agent's folder reader converts them to
the model's 32x32 RGB, as it would a user's photos."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def write_folder(out: Path, per_class: int, seed: int = 0) -> int:
    from PIL import Image

    from agent.model.data import load_mnist

    mnist = load_mnist()
    rng = np.random.default_rng(seed)
    written = 0
    for label in range(10):
        rows = np.flatnonzero(mnist.y_train == label)
        folder = out / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        for n, row in enumerate(np.sort(rng.choice(rows, per_class, replace=False))):
            pixels = np.clip(np.asarray(mnist.x_train[row]).reshape(28, 28) * 255 + 0.5, 0, 255)
            Image.fromarray(pixels.astype(np.uint8), mode="L").save(folder / f"{n:05d}.png")
            written += 1
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--per-class", type=int, default=1000)
    args = parser.parse_args()
    print(f"wrote {write_folder(args.out, args.per_class)} images under {args.out}")


if __name__ == "__main__":
    main()
