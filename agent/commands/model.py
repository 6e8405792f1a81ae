"""`edgegrove model`: check a model against the contract, or export a Keras model to .tflite."""

from __future__ import annotations

from agent.cli import Command

SUBCOMMANDS: dict[str, Command] = {
    "check": Command(
        "agent.commands.model_check",
        "load a model (mlp, module:factory, file.py:factory, .tflite), print its shapes, one "
        "gradient and its fingerprint",
    ),
    "evaluate": Command(
        "agent.commands.model_evaluate",
        "score a trained model (model.npz or model.tflite of `edgegrove job fetch`) on a data path",
    ),
    "export": Command(
        "agent.commands.model_export",
        "turn a Keras model into the .tflite a device trains (needs TensorFlow; a workstation only)",
    ),
}
