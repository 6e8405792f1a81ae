"""``load_model(spec)``: the model a spec names, checked against the contract.

Specs: ``mlp`` (the thesis MLP), ``pkg.module:factory`` (an installed module),
``path/to/file.py:factory`` (a file), or ``path/to/model.tflite`` (run by LiteRT).
Whatever a user's factory does wrong ends as one ``ModelError`` line.
"""

from __future__ import annotations

from agent.model.contract import Model, ModelError

DEFAULT_MODEL = "mlp"


def load_model(spec: str) -> Model:
    """The model ``spec`` names; ModelError (one line) if it cannot be loaded or breaks the
    contract."""
    raise ModelError(f"cannot load model {spec!r} yet")
