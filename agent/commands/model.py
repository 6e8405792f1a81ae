"""`edgegrove model`: a user's model for the fleet (docs/MODELS.md): check it against the
contract, or export a Keras model to the .tflite LiteRT agents train."""

from __future__ import annotations

from agent.cli import Command

SUBCOMMANDS: dict[str, Command] = {
    "check": Command(
        "agent.commands.model_check",
        "load a model (mlp, module:factory, file.py:factory, .tflite), print its shapes, one "
        "gradient and its fingerprint",
    ),
    "export": Command(
        "agent.commands.model_export",
        "a Keras model (.keras or file.py:function) as the .tflite LiteRT agents train (needs TensorFlow)",
    ),
}
