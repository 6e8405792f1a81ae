"""`edgegrove model`: a user's model for the fleet (docs/MODELS.md)."""

from __future__ import annotations

from agent.cli import Command

SUBCOMMANDS: dict[str, Command] = {
    "export": Command(
        "agent.commands.model_export",
        "a Keras model (.keras or file.py:function) as the .tflite LiteRT agents train (needs TensorFlow)",
    ),
}
