"""Writes the thesis MLP as a trainable ``.tflite`` model, without TensorFlow.

The model is serialized with ``flatbuffers`` and the TFLite schema module that ``ai-edge-litert``
ships (``ai_edge_litert.schema_py_generated``), using builtin ops only. Training state lives in
resource variables (VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE), initialized once by a
CALL_ONCE of an init subgraph:

- ``params``: the flat vector [W1 (784x512, used as x @ W1), b1, W2, b2]
- ``opt_step`` (shape [1]) and one or two slot vectors (SGD velocity; Adam m and v).

Signatures (one subgraph each):

    infer(x) -> logits                    evaluate(x, y) -> loss, logits
    gradients(x, y) -> loss, gradients    apply(gradients, lr[, bias_corrections]) -> step
    get_weights() -> params               set_weights(params) -> step
    get_state() -> state                  set_state(state) -> step

``state`` is [params, step, slots...], the same layout as the numpy backend's ``state()``.
The graph mirrors ``agent.model.mlp`` and ``agent.model.optim`` operation by operation.
The builder is deterministic: the same weights and hyperparameters give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.model import mlp

F32 = npt.NDArray[np.float32]
BUFFER_ALIGNMENT = 16  # constant data aligned like the TF converter does


def _schema() -> Any:
    try:
        import flatbuffers  # noqa: F401 - checked here so that the message below covers it
        from ai_edge_litert import schema_py_generated as schema
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise ImportError(
            "the LiteRT backend needs ai-edge-litert and flatbuffers: "
            "`pip install 'edgegrove[litert]'` (or `pip install ai-edge-litert flatbuffers`)"
        ) from exc
    return schema


@dataclass(frozen=True)
class OptimizerSpec:
    """What ``apply`` computes; mirrors ``agent.model.optim``."""

    name: str  # "sgd" or "adam"
    lr: float  # the default; ``apply`` takes the rate of each step as its input ``lr``
    momentum: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-7

    @property
    def slot_count(self) -> int:
        return 2 if self.name == "adam" else 1


class _ModelParts:
    """Model-wide tables: constant buffers (deduplicated) and operator codes."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.buffers: list[bytes] = [b""]  # buffer 0 is the empty sentinel
        self._buffer_index: dict[bytes, int] = {}
        self.opcodes: list[int] = []

    def buffer(self, data: bytes) -> int:
        if data not in self._buffer_index:
            self._buffer_index[data] = len(self.buffers)
            self.buffers.append(data)
        return self._buffer_index[data]

    def opcode(self, builtin: int) -> int:
        if builtin not in self.opcodes:
            self.opcodes.append(builtin)
        return self.opcodes.index(builtin)


_DTYPES: dict[np.dtype[Any], str] = {np.dtype(np.float32): "FLOAT32", np.dtype(np.int32): "INT32"}


class _Graph:
    """One subgraph under construction; methods return tensor indices."""

    def __init__(self, parts: _ModelParts, name: str) -> None:
        self.parts, self.s, self.name = parts, parts.schema, name
        self.tensors: list[Any] = []
        self.operators: list[Any] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.signature_inputs: list[tuple[str, int]] = []
        self.signature_outputs: list[tuple[str, int]] = []

    # -- tensors -----------------------------------------------------------------------------
    def tensor(self, name: str, shape: list[int], dtype: str = "FLOAT32", buffer: int = 0) -> int:
        t = self.s.TensorT()
        t.name = name
        t.type = getattr(self.s.TensorType, dtype)
        t.shape = [1 if d < 0 else d for d in shape]
        if any(d < 0 for d in shape):
            t.shapeSignature = list(shape)
        t.buffer = buffer
        self.tensors.append(t)
        return len(self.tensors) - 1

    def const(self, name: str, value: npt.ArrayLike, dtype: type = np.float32) -> int:
        array: npt.NDArray[Any] = np.array(value, dtype=dtype, order="C")  # 0-d stays 0-d
        data = array.astype(array.dtype.newbyteorder("<")).tobytes()
        dtype_name = _DTYPES[np.dtype(dtype)]
        return self.tensor(name, list(array.shape), dtype_name, self.parts.buffer(data))

    def input(self, name: str, shape: list[int], dtype: str = "FLOAT32") -> int:
        index = self.tensor(name, shape, dtype)
        self.inputs.append(index)
        self.signature_inputs.append((name, index))
        return index

    def output(self, name: str, index: int) -> None:
        self.outputs.append(index)
        self.signature_outputs.append((name, index))

    # -- operators ---------------------------------------------------------------------------
    def op(
        self,
        code: str,
        inputs: list[int],
        out: tuple[str, list[int], str] | None,
        options: tuple[str, Any] | None = None,
    ) -> int:
        """Append an operator; ``out`` is (name, shape, dtype) of its one output, or None."""
        output = [] if out is None else [self.tensor(*out)]
        operator = self.s.OperatorT()
        operator.opcodeIndex = self.parts.opcode(getattr(self.s.BuiltinOperator, code))
        operator.inputs, operator.outputs = list(inputs), output
        if options is not None:
            operator.builtinOptionsType = getattr(self.s.BuiltinOptions, options[0])
            operator.builtinOptions = options[1]
        self.operators.append(operator)
        return output[0] if output else -1

    def options(self, cls: str, **fields: Any) -> tuple[str, Any]:
        obj = getattr(self.s, cls + "T")()
        for key, value in fields.items():
            setattr(obj, key, value)
        return cls, obj

    def binary(self, code: str, a: int, b: int, name: str, shape: list[int]) -> int:
        opts = {"ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions", "DIV": "DivOptions"}
        options = self.options(opts[code]) if code in opts else None
        return self.op(code, [a, b], (name, shape, "FLOAT32"), options)

    def reduce(self, code: str, x: int, axes: list[int], name: str, shape: list[int]) -> int:
        axis = self.const(f"{name}/axes", axes, np.int32)
        return self.op(code, [x, axis], (name, shape, "FLOAT32"), self.options("ReducerOptions"))

    def reshape(self, x: int, shape: list[int], name: str) -> int:
        target = self.const(f"{name}/shape", shape, np.int32)
        return self.op("RESHAPE", [x, target], (name, shape, "FLOAT32"))

    def slice(self, x: int, begin: int, size: int, name: str) -> int:
        b, n = self.const(f"{name}/begin", [begin], np.int32), self.const(f"{name}/size", [size], np.int32)
        return self.op("SLICE", [x, b, n], (name, [size], "FLOAT32"), self.options("SliceOptions"))

    def matmul(self, a: int, b: int, name: str, shape: list[int], adj_x: bool = False,
               adj_y: bool = False) -> int:
        options = self.options("BatchMatMulOptions", adjX=adj_x, adjY=adj_y)
        return self.op("BATCH_MATMUL", [a, b], (name, shape, "FLOAT32"), options)

    def concat(self, parts: list[int], name: str, length: int) -> int:
        options = self.options("ConcatenationOptions", axis=0)
        return self.op("CONCATENATION", parts, (name, [length], "FLOAT32"), options)

    # -- resource variables --------------------------------------------------------------------
    def call_once(self, init_subgraph: int) -> None:
        self.op("CALL_ONCE", [], None, self.options("CallOnceOptions", initSubgraphIndex=init_subgraph))

    def handle(self, variable: str) -> int:
        options = self.options("VarHandleOptions", container="", sharedName=variable)
        return self.op("VAR_HANDLE", [], (f"{variable}/handle", [], "RESOURCE"), options)

    def read(self, variable: str, shape: list[int]) -> int:
        return self.op("READ_VARIABLE", [self.handle(variable)], (variable, shape, "FLOAT32"))

    def assign(self, variable: str, value: int) -> None:
        self.op("ASSIGN_VARIABLE", [self.handle(variable), value], None)

    # -- packing -------------------------------------------------------------------------------
    def to_object(self) -> Any:
        subgraph = self.s.SubGraphT()
        subgraph.name, subgraph.tensors, subgraph.operators = self.name, self.tensors, self.operators
        subgraph.inputs, subgraph.outputs = self.inputs, self.outputs
        return subgraph


def _slot_names(spec: OptimizerSpec) -> list[str]:
    return [f"opt_slot{i}" for i in range(spec.slot_count)]


def state_size(spec: OptimizerSpec) -> int:
    return mlp.PARAM_COUNT * (1 + spec.slot_count) + 1


# ---- the model's pieces, each written once and shared by the signatures -------------------------
def _weights(g: _Graph) -> tuple[int, int, int, int]:
    """W1, b1, W2, b2 cut out of the ``params`` variable."""
    params = g.read("params", [mlp.PARAM_COUNT])
    names = ("w1", "b1", "w2", "b2")
    pieces = []
    for name, offset, size, shape in zip(names, mlp.OFFSETS, mlp.SIZES, mlp.SHAPES, strict=True):
        flat = g.slice(params, offset, size, f"{name}/flat")
        pieces.append(g.reshape(flat, list(shape), name) if len(shape) == 2 else flat)
    w1, b1, w2, b2 = pieces
    return w1, b1, w2, b2


def _forward(g: _Graph, x: int) -> tuple[int, int, int, tuple[int, int, int, int]]:
    """(pre-activation, hidden, logits, weights), as ``mlp._hidden`` and ``mlp.forward``."""
    weights = _weights(g)
    w1, b1, w2, b2 = weights
    hidden_shape, logits_shape = [-1, mlp.N_HIDDEN], [-1, mlp.N_OUT]
    pre = g.binary("ADD", g.matmul(x, w1, "x_w1", hidden_shape), b1, "pre", hidden_shape)
    hidden = g.op("RELU", [pre], ("hidden", hidden_shape, "FLOAT32"))
    logits = g.binary("ADD", g.matmul(hidden, w2, "h_w2", logits_shape), b2, "logits", logits_shape)
    return pre, hidden, logits, weights


def _loss(g: _Graph, logits: int, y: int) -> tuple[int, int, int]:
    """(loss, probabilities, one-hot labels), as ``mlp.softmax_parts`` and the mean CE."""
    shape = [-1, mlp.N_OUT]
    probs = g.op("SOFTMAX", [logits], ("probs", shape, "FLOAT32"), g.options("SoftmaxOptions", beta=1.0))
    log_probs = g.op("LOG_SOFTMAX", [logits], ("log_probs", shape, "FLOAT32"),
                     g.options("LogSoftmaxOptions"))
    depth = g.const("depth", np.int32(mlp.N_OUT), np.int32)
    on, off = g.const("on", np.float32(1.0)), g.const("off", np.float32(0.0))
    one_hot = g.op("ONE_HOT", [y, depth, on, off], ("one_hot", shape, "FLOAT32"),
                   g.options("OneHotOptions", axis=-1))
    picked = g.reduce("SUM", g.binary("MUL", one_hot, log_probs, "picked_all", shape), [1],
                      "picked", [-1])
    loss = g.op("NEG", [g.reduce("MEAN", picked, [0], "mean_log_prob", [])], ("loss", [], "FLOAT32"))
    return loss, probs, one_hot


def _gradient(g: _Graph, x: int, y: int) -> tuple[int, int]:
    """(loss, flat gradient), as ``mlp.loss_and_grad``."""
    pre, hidden, logits, (_, _, w2, _) = _forward(g, x)
    loss, probs, one_hot = _loss(g, logits, y)
    batch = g.reduce("SUM", one_hot, [0, 1], "batch", [])  # every one-hot row sums to 1
    d_logits = g.binary("DIV", g.binary("SUB", probs, one_hot, "residual", [-1, mlp.N_OUT]),
                        batch, "d_logits", [-1, mlp.N_OUT])
    hidden_shape = [-1, mlp.N_HIDDEN]
    d_hidden = g.matmul(d_logits, w2, "d_hidden", hidden_shape, adj_y=True)
    positive = g.op("GREATER", [pre, g.const("zero", np.float32(0.0))],
                    ("positive", hidden_shape, "BOOL"), g.options("GreaterOptions"))
    mask = g.op("CAST", [positive], ("mask", hidden_shape, "FLOAT32"),
                g.options("CastOptions", inDataType=g.s.TensorType.BOOL,
                          outDataType=g.s.TensorType.FLOAT32))
    d_pre = g.binary("MUL", d_hidden, mask, "d_pre", hidden_shape)
    grads = [
        g.reshape(g.matmul(x, d_pre, "g_w1/matrix", [mlp.N_IN, mlp.N_HIDDEN], adj_x=True),
                  [mlp.SIZES[0]], "g_w1"),
        g.reduce("SUM", d_pre, [0], "g_b1", [mlp.N_HIDDEN]),
        g.reshape(g.matmul(hidden, d_logits, "g_w2/matrix", [mlp.N_HIDDEN, mlp.N_OUT], adj_x=True),
                  [mlp.SIZES[2]], "g_w2"),
        g.reduce("SUM", d_logits, [0], "g_b2", [mlp.N_OUT]),
    ]
    return loss, g.concat(grads, "gradients", mlp.PARAM_COUNT)


def _apply(g: _Graph, grad: int, lr: int, spec: OptimizerSpec, bias: int | None = None) -> int:
    """One optimizer step with rate ``lr`` on the variables; returns the new step count.
    As ``optim``; Adam's ``bias`` is the input [1 - b1**t, 1 - b2**t] of this step t."""
    n = [mlp.PARAM_COUNT]
    params = g.read("params", n)
    step = g.binary("ADD", g.read("opt_step", [1]), g.const("one", [1.0]), "step", [1])
    c = lambda name, v: g.const(name, np.float32(v))  # noqa: E731 - float32 scalar constants
    if spec.name == "sgd":
        velocity = g.binary("ADD", g.binary("MUL", g.read("opt_slot0", n), c("momentum", spec.momentum),
                                            "v_decayed", n), grad, "velocity", n)
        update = g.binary("MUL", lr, velocity, "update", n)
        g.assign("opt_slot0", velocity)
    else:
        m = g.binary("ADD", g.binary("MUL", c("b1", spec.b1), g.read("opt_slot0", n), "m_decayed", n),
                     g.binary("MUL", c("one_minus_b1", 1.0 - spec.b1), grad, "m_new", n), "m", n)
        squared = g.binary("MUL", grad, grad, "grad_squared", n)
        v = g.binary("ADD", g.binary("MUL", c("b2", spec.b2), g.read("opt_slot1", n), "v_decayed", n),
                     g.binary("MUL", c("one_minus_b2", 1.0 - spec.b2), squared, "v_new", n), "v", n)
        # (1 - b1**t, 1 - b2**t) come in from optim.bias_corrections, not from a POW here:
        # libm's pow differs in the last bit between machines.
        assert bias is not None
        corrections = [g.slice(bias, i, 1, f"correction{i + 1}") for i in range(2)]
        m_hat = g.binary("DIV", m, corrections[0], "m_hat", n)
        v_hat = g.binary("DIV", v, corrections[1], "v_hat", n)
        root = g.op("SQRT", [v_hat], ("v_hat_sqrt", n, "FLOAT32"))
        update = g.binary("DIV", g.binary("MUL", lr, m_hat, "lr_m_hat", n),
                          g.binary("ADD", root, c("eps", spec.eps), "denominator", n), "update", n)
        g.assign("opt_slot0", m)
        g.assign("opt_slot1", v)
    g.assign("params", g.binary("SUB", params, update, "new_params", n))
    g.assign("opt_step", step)
    return step


def _read_state(g: _Graph, spec: OptimizerSpec) -> int:
    parts = [g.read("params", [mlp.PARAM_COUNT]), g.read("opt_step", [1])]
    parts += [g.read(name, [mlp.PARAM_COUNT]) for name in _slot_names(spec)]
    return g.concat(parts, "state", state_size(spec))


def _write_state(g: _Graph, state: int, spec: OptimizerSpec) -> int:
    """Assign every variable from a flat state vector; returns the loaded step count."""
    g.assign("params", g.slice(state, 0, mlp.PARAM_COUNT, "state/params"))
    step = g.slice(state, mlp.PARAM_COUNT, 1, "state/step")
    g.assign("opt_step", step)
    for i, name in enumerate(_slot_names(spec)):
        g.assign(name, g.slice(state, mlp.PARAM_COUNT * (1 + i) + 1, mlp.PARAM_COUNT, f"state/{name}"))
    return step


def _init_graph(parts: _ModelParts, params: F32, spec: OptimizerSpec) -> _Graph:
    """Runs once (CALL_ONCE): initial weights, step 0, zeroed slots."""
    g = _Graph(parts, "init")
    g.assign("params", g.const("initial_params", params))
    g.assign("opt_step", g.const("initial_step", np.zeros(1, np.float32)))
    dims = g.const("slot_dims", [mlp.PARAM_COUNT], np.int32)
    for name in _slot_names(spec):
        zeros = g.op("FILL", [dims, g.const("zero", np.float32(0.0))],
                     (f"{name}/zeros", [mlp.PARAM_COUNT], "FLOAT32"), g.options("FillOptions"))
        g.assign(name, zeros)
    return g


def _signature_graphs(parts: _ModelParts, spec: OptimizerSpec, init_index: int) -> list[_Graph]:
    graphs = []
    n = [mlp.PARAM_COUNT]
    for name in ("infer", "evaluate", "gradients", "apply", "get_weights", "set_weights",
                 "get_state", "set_state"):
        g = _Graph(parts, name)
        g.call_once(init_index)
        if name in ("infer", "evaluate", "gradients"):
            x = g.input("x", [-1, mlp.N_IN])
            y = g.input("y", [-1], "INT32") if name != "infer" else -1
            if name == "gradients":
                loss, grad = _gradient(g, x, y)
                g.output("loss", loss)
                g.output("gradients", grad)
            else:
                logits = _forward(g, x)[2]
                if name == "evaluate":
                    g.output("loss", _loss(g, logits, y)[0])
                g.output("logits", logits)
        elif name == "apply":
            bias = g.input("bias_corrections", [2]) if spec.name == "adam" else None
            g.output("step", _apply(g, g.input("gradients", n), g.input("lr", [1]), spec, bias))
        elif name == "get_weights":
            g.output("params", g.read("params", n))
        elif name == "set_weights":
            g.assign("params", g.input("params", n))
            g.output("step", g.read("opt_step", [1]))
        elif name == "get_state":
            g.output("state", _read_state(g, spec))
        else:
            g.output("step", _write_state(g, g.input("state", [state_size(spec)]), spec))
        graphs.append(g)
    return graphs


def build_model(params: F32, spec: OptimizerSpec) -> bytes:
    """The ``.tflite`` flatbuffer (deterministic: same inputs -> same bytes)."""
    params = np.ascontiguousarray(params, dtype=np.float32)
    if params.shape != (mlp.PARAM_COUNT,):
        raise ValueError(f"params must be a flat vector of {mlp.PARAM_COUNT}, got {params.shape}")
    if spec.name not in ("sgd", "adam"):
        raise ValueError(f"unknown optimizer {spec.name!r} (sgd or adam)")
    schema = _schema()
    import flatbuffers  # present: _schema() checked it

    parts = _ModelParts(schema)
    signature_graphs = _signature_graphs(parts, spec, init_index=8)
    graphs = [*signature_graphs, _init_graph(parts, params, spec)]

    model = schema.ModelT()
    model.version = 3
    model.description = "edgegrove MLP 784-512-10 (trainable; built by agent.model.tflite_builder)"
    model.subgraphs = [g.to_object() for g in graphs]
    model.operatorCodes = [_opcode(schema, code) for code in parts.opcodes]
    model.buffers = [_AlignedBuffer(data) for data in parts.buffers]
    model.signatureDefs = [_signature(schema, g, i) for i, g in enumerate(signature_graphs)]
    builder = flatbuffers.Builder(len(params) * 4 + (1 << 16))
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _opcode(schema: Any, builtin: int) -> Any:
    code = schema.OperatorCodeT()
    code.builtinCode = builtin
    code.deprecatedBuiltinCode = min(builtin, schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
    code.version = 1
    return code


def _signature(schema: Any, g: _Graph, subgraph_index: int) -> Any:
    def tensor_map(name: str, index: int) -> Any:
        m = schema.TensorMapT()
        m.name, m.tensorIndex = name, index
        return m

    sig = schema.SignatureDefT()
    sig.signatureKey, sig.subgraphIndex = g.name, subgraph_index
    sig.inputs = [tensor_map(n, i) for n, i in g.signature_inputs]
    sig.outputs = [tensor_map(n, i) for n, i in g.signature_outputs]
    return sig


class _AlignedBuffer:
    """A schema Buffer whose bytes start on a 16-byte boundary (the object API aligns to 1)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def Pack(self, builder: Any) -> int:
        schema = _schema()
        data_offset = None
        if self.data:
            builder.StartVector(1, len(self.data), BUFFER_ALIGNMENT)
            builder.head -= len(self.data)
            builder.Bytes[builder.head : builder.head + len(self.data)] = self.data
            data_offset = builder.EndVector()
        schema.BufferStart(builder)
        if data_offset is not None:
            schema.BufferAddData(builder, data_offset)
        return int(schema.BufferEnd(builder))
