"""`edgegrove job`: submit a job to the enrolled devices, follow it, stop it, fetch its model."""

from __future__ import annotations

from agent.cli import Command

SUBCOMMANDS: dict[str, Command] = {
    "submit": Command("agent.commands.job_submit",
                      "check a job file, assign its devices and publish it, signed (model file included)"),
    "list": Command("agent.commands.job_list", "the jobs on the broker and how their devices are doing"),
    "status": Command("agent.commands.job_status", "one job: each device's execution state, the last round"),
    "logs": Command("agent.commands.job_logs", "the job's devices' warnings and errors, and state changes"),
    "stop": Command("agent.commands.job_stop", "end a job (a signed stop control)"),
    "fetch": Command("agent.commands.job_fetch",
                     "write the trained model: model.npz, an inference model.tflite, metrics.json"),
    "keygen": Command("agent.commands.job_keygen", "make the operator's signing key pair"),
}
