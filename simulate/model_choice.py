"""What the fleet of a simulation trains, from `edgegrove simulate`'s flags: the model, the
backend(s), the dataset and how it is split among the agents.

``--model SPEC`` (the thesis MLP by default, ``file.py:factory``, ``pkg.module:factory`` or a
``.tflite``), ``--backend numpy|litert|mixed``, ``--dataset mnist|digits|PATH`` and
``--partition iid|shards:K|dirichlet:ALPHA``. Every agent gets the same model, data and
partition options and computes its own shard. ``mixed`` alternates numpy (even ids) and LiteRT
(odd ids) agents; with a ``.tflite`` model the numpy agents run ``--numpy-model`` (the same
architecture as a Python factory: the fleet refuses it unless its fingerprint is the
``.tflite``'s). Checked before anything starts: one ``UsageError`` line, exit 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.model.datasets import DATASETS
from agent.model.partition import parse_partition
from agent.validate import UsageError

BACKENDS = ("numpy", "litert", "mixed")
# The [agent] options of a scenario that these flags decide (the flags win over them).
MODEL_OPTIONS = ("model", "backend", "data", "dataset", "partition")
DEFAULT_MODEL = "mlp"
DEFAULT_DATASET = "mnist"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, metavar="SPEC",
                        help="the model every agent trains: mlp (the thesis MLP), path/to/file.py:factory, "
                             "pkg.module:factory or a .tflite file; default: the scenario's, else mlp")
    parser.add_argument("--backend", default=None, metavar="{numpy,litert,mixed}",
                        help="numpy, litert, or mixed (even ids numpy, odd ids LiteRT); "
                             "default: the scenario's, else numpy (litert for a .tflite model)")
    parser.add_argument("--numpy-model", default=None, metavar="SPEC",
                        help="with --backend mixed and a .tflite --model: the Python factory of "
                             "the same model that the numpy agents run")
    parser.add_argument("--dataset", default=None, metavar="NAME|PATH",
                        help=f"{' or '.join(DATASETS)} (shipped by a package), or a path (.npz, CSV, "
                             "folder of images per class) every agent reads; default: the scenario's, else mnist")
    parser.add_argument("--partition", default=None, metavar="SPEC",
                        help="how the agents split the data: iid, shards:K or dirichlet:ALPHA; "
                             "default: the scenario's, else iid")


@dataclass(frozen=True)
class ModelChoice:
    model: str = DEFAULT_MODEL
    backend: str = "numpy"
    numpy_model: str | None = None  # mixed with a .tflite: what the numpy agents run
    dataset: str = DEFAULT_DATASET  # a name of DATASETS or an absolute path
    partition: str = "iid"

    @property
    def is_thesis_setup(self) -> bool:
        """The thesis MLP on MNIST: what the single-machine baseline reproduces."""
        return self.model == DEFAULT_MODEL and self.dataset == DEFAULT_DATASET and self.numpy_model is None

    def backend_of(self, node: int) -> str:
        if self.backend != "mixed":
            return self.backend
        return "numpy" if node % 2 == 0 else "litert"

    def model_of(self, node: int) -> str:
        if self.backend_of(node) == "numpy" and self.numpy_model is not None:
            return self.numpy_model
        return self.model

    def agent_options(self, node: int) -> dict[str, Any]:
        """The options agent ``node`` runs with (only what differs from the agent's defaults,
        so the default run's agents start exactly as before)."""
        options: dict[str, Any] = {}
        if self.backend_of(node) != "numpy":
            options["backend"] = self.backend_of(node)
        if self.model_of(node) != DEFAULT_MODEL:
            options["model"] = self.model_of(node)
        if self.dataset in DATASETS:
            if self.dataset != DEFAULT_DATASET:
                options["dataset"] = self.dataset
        else:
            options["data"] = self.dataset
        if self.partition != "iid":
            options["partition"] = self.partition
        return options

    def describe(self) -> str:
        backend = self.backend if self.numpy_model is None else f"{self.backend} (numpy agents: {self.numpy_model})"
        return f"model {self.model} on {backend}, dataset {self.dataset}, partition {self.partition}"


def choose(args: argparse.Namespace, scenario: dict[str, Any] | None = None) -> ModelChoice:
    """The flags over the scenario's [agent] options, checked; UsageError (one line) for the
    first bad one."""
    own = scenario or {}
    model = _model_spec("--model", args.model or own.get("model") or DEFAULT_MODEL)
    tflite = model.endswith(".tflite")
    backend = args.backend or own.get("backend") or ("litert" if tflite else "numpy")
    if backend not in BACKENDS:
        raise UsageError(f"--backend {backend}: use {', '.join(BACKENDS)}")
    numpy_model = _model_spec("--numpy-model", args.numpy_model) if args.numpy_model else None
    _check_backend(model, backend, numpy_model)
    dataset = args.dataset or own.get("data") or own.get("dataset") or DEFAULT_DATASET
    return ModelChoice(model, backend, numpy_model, _dataset(str(dataset)),
                       _partition(args.partition or own.get("partition") or "iid"))


def check_models(choice: ModelChoice, seed: int = 0) -> None:
    """Load the model(s) as the agents will (a factory that raises, a .tflite without its
    signatures: one line here instead of every agent failing), and in a mixed fleet make sure
    the numpy agents' factory is the .tflite's model: same fingerprint, or the fleet would
    refuse half of its agents."""
    from agent.model.contract import ModelError, fingerprint
    from agent.model.loader import load_model

    prints = {}
    for flag, spec in (("--model", choice.model), ("--numpy-model", choice.numpy_model)):
        if spec is None:
            continue
        try:
            prints[flag] = fingerprint(load_model(spec), seed)
        except ModelError as exc:
            raise UsageError(f"{flag} {spec}: {exc}") from None
    if len(set(prints.values())) > 1:
        raise UsageError(f"--numpy-model {choice.numpy_model} is not the model of --model {choice.model} "
                         f"(fingerprints {prints['--numpy-model']} and {prints['--model']}): the fleet "
                         "would refuse the numpy agents; give the Python twin of the .tflite")


def check_dataset(choice: ModelChoice, options: Mapping[str, Any], nodes: int) -> None:
    """A file or folder --dataset read once here as the agents will, so a bad one is one line
    before anything starts (not a broker and a fleet that then fail). Its size is weighed
    first against the memory the ``nodes`` agents on this machine share (and data_max_mb): a
    file too large is refused before it is read."""
    if choice.dataset in DATASETS:
        return
    from agent.model.contract import ModelError
    from agent.model.data import DataError
    from agent.model.data_budget import DataBudget, available_memory
    from agent.model.datasets import DataRequest, load_agent_data
    from agent.model.loader import load_model

    request = DataRequest(Path(choice.dataset), label_column=str(options.get("label_column", "label")),
                          holdout=float(options.get("holdout", 0.1)), partition=choice.partition,
                          seed=int(options.get("seed", 0)),
                          budget=DataBudget(int(float(options.get("data_max_mb", 0)) * 2**20),
                                            available_memory() // max(1, nodes)))
    try:
        load_agent_data(request, 0, 1, load_model(choice.model_of(0)))
    except (DataError, ModelError) as exc:
        raise UsageError(f"--dataset: {exc}") from None


def _check_backend(model: str, backend: str, numpy_model: str | None) -> None:
    tflite = model.endswith(".tflite")
    if numpy_model is not None and not (backend == "mixed" and tflite):
        raise UsageError("--numpy-model is for --backend mixed with a .tflite --model: drop it")
    if numpy_model is not None and numpy_model.endswith(".tflite"):
        raise UsageError(f"--numpy-model {numpy_model}: the numpy agents run a Python factory "
                         "(file.py:factory), not a .tflite")
    if backend == "numpy" and tflite:
        raise UsageError(f"--model {model} is a .tflite file: run it with --backend litert "
                         "(or mixed with --numpy-model file.py:factory)")
    if backend in ("litert", "mixed") and model != DEFAULT_MODEL and not tflite:
        raise UsageError(f"--backend {backend} runs the thesis MLP or a .tflite model, not {model}: "
                         "use --backend numpy, or export it (edgegrove model export)")
    if backend == "mixed" and tflite and numpy_model is None:
        raise UsageError(f"--backend mixed with {model}: the numpy agents need the same model as a "
                         "Python factory: add --numpy-model path/to/model.py:factory")


def _model_spec(flag: str, spec: str) -> str:
    """mlp, pkg.module:factory, an existing file.py:factory or an existing .tflite; files
    become absolute paths (the agents may run elsewhere)."""
    spec = spec.strip()
    if spec == DEFAULT_MODEL:
        return spec
    if spec.endswith(".tflite"):
        return str(_existing_file(flag, spec))
    target, sep, factory = spec.rpartition(":")
    if not sep or not target or not factory.isidentifier():
        raise UsageError(f"{flag} {spec}: give mlp, path/to/file.py:factory, pkg.module:factory "
                         "or a .tflite file")
    if target.endswith(".py"):
        return f"{_existing_file(flag, target)}:{factory}"
    if not all(part.isidentifier() for part in target.split(".")):
        raise UsageError(f"{flag} {spec}: {target!r} is neither a .py file nor a module name")
    return spec


def _existing_file(flag: str, text: str) -> Path:
    path = Path(text).expanduser()
    if path.is_dir():
        raise UsageError(f"{flag} {text}: is a directory: give a file")
    if not path.is_file():
        raise UsageError(f"{flag} {text}: does not exist: check the path")
    return path.resolve()


def _dataset(text: str) -> str:
    if text in DATASETS:
        return text
    path = Path(text).expanduser()
    if not path.exists():
        raise UsageError(f"--dataset {text}: neither {' nor '.join(DATASETS)} nor an existing file "
                         "or folder: check the path")
    return str(path.resolve())


def _partition(text: str) -> str:
    try:
        return str(parse_partition(text))
    except ValueError as exc:
        raise UsageError(f"--partition {text}: {exc}") from None
