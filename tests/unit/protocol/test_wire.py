"""The binary frame format: round trips, quantization bounds, and a decoder that never raises."""

from __future__ import annotations

import itertools
import math
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.protocol.wire import (
    _HEADER,
    HEADER_SIZE,
    MAX_CHUNKS,
    MAX_NODE_ID,
    NO_NODE,
    DType,
    Flag,
    Frame,
    Kind,
    Rejection,
    RejectReason,
    decode,
    encode,
    float_to_half,
    half_to_float,
    job_hash,
    quantize,
    value_bytes,
)

FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JOB = job_hash("mnist-7")
FLAG_COMBINATIONS = [Flag.NONE, Flag.BROADCAST, Flag.FINAL, Flag.BROADCAST | Flag.FINAL]
FLOAT_DTYPES = [DType.F32, DType.F16, DType.I8]

u32 = st.integers(0, 2**32 - 1)
node_ids = st.integers(0, MAX_NODE_ID)
finite_f32 = st.floats(-(2.0**100), 2.0**100, allow_nan=False, allow_infinity=False, width=32)
in_f16_range = st.floats(-65504, 65504, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def frames(draw: st.DrawFn) -> Frame:
    count = draw(st.integers(1, MAX_CHUNKS))
    frame = Frame(
        kind=draw(st.sampled_from(Kind)),
        job=draw(u32),
        round=draw(u32),
        sender=draw(node_ids),
        chunk_index=draw(st.integers(0, count - 1)),
        chunk_count=count,
        flags=draw(st.sampled_from(FLAG_COMBINATIONS)),
        origin=draw(st.one_of(node_ids, st.just(NO_NODE))),
        target=draw(st.one_of(node_ids, st.just(NO_NODE))),
        model_hash=draw(u32),
        contributors=draw(st.frozensets(node_ids, max_size=40)),
    )
    dtype = draw(st.sampled_from(DType))
    if dtype == DType.U32:
        return frame.with_indices(draw(st.lists(u32, max_size=64)))
    values = draw(st.lists(in_f16_range if dtype == DType.F16 else finite_f32, max_size=64))
    return frame.with_values(np.array(values, dtype=np.float32), dtype)


def assert_typed(result: Frame | Rejection) -> None:
    """A decoder answer: a typed rejection, or a frame that is internally consistent."""
    if isinstance(result, Rejection):
        assert isinstance(result.reason, RejectReason)
        return
    assert isinstance(result, Frame)
    assert 0 <= result.chunk_index < result.chunk_count <= MAX_CHUNKS
    assert result.sender <= MAX_NODE_ID and result.origin <= MAX_NODE_ID
    assert all(0 <= c <= MAX_NODE_ID for c in result.contributors)
    assert math.isfinite(result.scale)
    if result.dtype != DType.U32:
        assert np.all(np.isfinite(result.values()))
    assert decode(encode(result)) == result  # what we accepted, we can send on unchanged


def sample_frame(values: np.ndarray | None = None, dtype: DType = DType.F32) -> Frame:
    frame = Frame(kind=Kind.DATA, job=JOB, round=12, sender=3, chunk_index=1, chunk_count=4,
                  contributors=frozenset({3, 7, 8}))
    return frame.with_values(np.arange(5, dtype=np.float32) if values is None else values, dtype)


def with_crc(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


# ---------------------------------------------------------------- round trips


@settings(max_examples=300, deadline=None)
@given(frames())
def test_round_trip_of_any_frame(frame: Frame) -> None:
    data = encode(frame)
    assert decode(data) == frame
    assert decode(data, expected_sender=frame.sender, job=frame.job) == frame
    assert encode(decode(data)) == data  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "dtype", "flags"),
                         list(itertools.product(Kind, DType, FLAG_COMBINATIONS)))
def test_round_trip_of_every_kind_dtype_flag_combination(kind: Kind, dtype: DType, flags: Flag) -> None:
    frame = Frame(kind=kind, job=JOB, round=7, sender=5, chunk_index=2, chunk_count=3,
                  flags=flags, target=9, model_hash=0xDEADBEEF, contributors=frozenset({0, 5, 1023}))
    frame = frame.with_indices([0, 2, 2**32 - 1]) if dtype == DType.U32 else frame.with_values(
        np.array([-1.5, 0.0, 0.25, 3.0], dtype=np.float32), dtype)
    decoded = decode(encode(frame), expected_sender=5, job=JOB)
    assert decoded == frame
    assert isinstance(decoded, Frame)
    assert decoded.is_broadcast == bool(flags & Flag.BROADCAST)
    if dtype == DType.U32:
        assert decoded.indices() == [0, 2, 2**32 - 1]
    else:
        np.testing.assert_allclose(decoded.values(), [-1.5, 0.0, 0.25, 3.0], atol=3.0 / 254)


def test_encode_refuses_a_ragged_payload() -> None:
    frame = Frame(kind=Kind.DATA, job=JOB, round=1, sender=1, dtype=DType.F16, payload=b"abc")
    with pytest.raises(ValueError, match="whole F16 values"):
        encode(frame)


def test_origin_defaults_to_the_sender_and_empty_frames_work() -> None:
    frame = Frame(kind=Kind.ACK, job=JOB, round=0, sender=4)
    assert frame.origin == 4
    assert decode(encode(frame)) == frame


# ---------------------------------------------------------------- quantization


@given(st.lists(in_f16_range, min_size=1, max_size=200))
def test_f16_error_is_half_a_unit_in_the_last_place(values: list[float]) -> None:
    v = np.array(values, dtype=np.float32)
    payload, scale = quantize(v, DType.F16)
    back = np.frombuffer(payload, dtype="<f2").astype(np.float32)
    bound = np.maximum(np.abs(v) * 2.0**-11, 2.0**-25)  # 11 significant bits; subnormals
    assert scale == 1.0
    assert np.all(np.abs(back - v) <= bound)


def test_f16_saturates_finite_values_beyond_its_range() -> None:
    frame = decode(encode(sample_frame(np.array([1e6, -1e9], dtype=np.float32), DType.F16)))
    assert isinstance(frame, Frame)
    assert list(frame.values()) == [65504.0, -65504.0]


def test_float_to_half_gives_numpys_bits_across_float16s_range() -> None:
    # Every float16 value and the float32s around each rounding boundary (the midpoints to the
    # next value, ties included, two ulps either side), a sweep of every 1021st float32 below
    # 65520 (where float16 overflows), both signs: normal and subnormal results, rounding up
    # into the next exponent, zero and float32 subnormals.
    halves = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = ((halves[:-1] + halves[1:]) / 2).astype(np.float32).view(np.uint32)
    near = (mids.astype(np.int64)[:, None] + np.arange(-2, 3)[None, :]).ravel().astype(np.uint32)
    sweep = np.arange(0, 0x477FF000, 1021, dtype=np.uint32)
    bits = np.concatenate([halves.astype(np.float32).view(np.uint32), near, sweep, [0x477FEFFF]])
    for v in (bits.view(np.float32), -bits.view(np.float32)):
        ours = float_to_half(v)
        assert ours is not None and ours.dtype == np.dtype("<u2")
        assert np.array_equal(ours, v.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("bad", [65520.0, -1e9, math.inf, -math.inf, math.nan])
def test_float_to_half_leaves_overflow_and_non_finite_values_to_the_caller(bad: float) -> None:
    assert float_to_half(np.array([1.0, bad], dtype=np.float32)) is None
    assert float_to_half(np.array([65519.996], dtype=np.float32)) is not None  # rounds to 65504
    assert float_to_half(np.zeros(0, dtype=np.float32)) is not None


def test_half_to_float_gives_numpys_values_for_every_float16() -> None:
    every = np.arange(1 << 16, dtype=np.uint16)
    ours = half_to_float(every.astype("<u2").tobytes())
    assert ours.dtype == np.float32
    assert np.array_equal(ours.view(np.uint32), every.view(np.float16).astype(np.float32).view(np.uint32))


# The scale travels as a float32: for a subnormal peak (below ~1.5e-36) it can only be a
# multiple of 2**-149, and its rounding, 127 times over, exceeds half a step.
SCALE_ROUNDING = 127 * 2.0**-150


@given(st.lists(finite_f32, min_size=1, max_size=200))
@example(values=[1.615697129366514e-42])  # found by hypothesis: a scale of 9 x 2**-149
def test_i8_error_is_at_most_half_a_step(values: list[float]) -> None:
    v = np.array(values, dtype=np.float32)
    frame = decode(encode(sample_frame(v, DType.I8)))
    assert isinstance(frame, Frame)
    peak = float(np.max(np.abs(v)))
    bound = peak / 254 * (1 + 1e-5) + peak * 1e-6 + SCALE_ROUNDING
    assert np.all(np.abs(frame.values().astype(np.float64) - v) <= bound)
    assert frame.scale > 0


def test_i8_of_zeros_is_exact() -> None:
    frame = decode(encode(sample_frame(np.zeros(8, dtype=np.float32), DType.I8)))
    assert isinstance(frame, Frame)
    assert np.array_equal(frame.values(), np.zeros(8, dtype=np.float32))


def test_i8_of_subnormal_values_keeps_a_positive_scale() -> None:
    values = np.array([1e-44, -3e-45, 0.0], dtype=np.float32)
    frame = decode(encode(sample_frame(values, DType.I8)))
    assert isinstance(frame, Frame), frame
    assert np.array_equal(frame.values(), values)


def test_u32_cannot_carry_values() -> None:
    with pytest.raises(ValueError, match="cannot travel"):
        quantize(np.ones(3, dtype=np.float32), DType.U32)


# ---------------------------------------------------------------- non-finite values


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_payloads_are_rejected_by_the_receiver(dtype: DType, bad: float) -> None:
    values = np.array([1.0, bad, 2.0], dtype=np.float32)
    result = decode(encode(sample_frame(values, dtype)))
    assert isinstance(result, Rejection)
    assert result.reason == RejectReason.BAD_VALUES


@pytest.mark.parametrize("scale", [math.nan, math.inf, 0.0, -1.0])
def test_i8_frames_with_a_bad_scale_are_rejected(scale: float) -> None:
    frame = Frame(kind=Kind.DATA, job=JOB, round=1, sender=2, dtype=DType.I8, scale=scale,
                  payload=bytes([1, 2, 3]))
    result = decode(encode(frame))
    assert isinstance(result, Rejection) and result.reason == RejectReason.BAD_VALUES


# ---------------------------------------------------------------- typed rejections


def test_forged_sender_and_foreign_job_are_rejected() -> None:
    data = encode(sample_frame())
    forged = decode(data, expected_sender=4, job=JOB)
    assert isinstance(forged, Rejection) and forged.reason == RejectReason.FORGED_SENDER
    foreign = decode(data, expected_sender=3, job=job_hash("other-job"))
    assert isinstance(foreign, Rejection) and foreign.reason == RejectReason.FOREIGN_JOB
    assert isinstance(decode(data, expected_sender=3, job=JOB), Frame)


def _header_fields(frame: Frame) -> list[int | float | bytes]:
    return list(_HEADER.unpack_from(encode(frame)))


FIELD = {name: i for i, name in enumerate(
    ["magic", "version", "kind", "flags", "dtype", "job", "round", "index", "count", "sender", "origin", "target", "model_hash", "scale", "n_values", "bitmap_len"])}


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("magic", b"MQTT", RejectReason.BAD_MAGIC),
    ("version", 2, RejectReason.BAD_VERSION),
    ("kind", 0, RejectReason.BAD_KIND),
    ("kind", 99, RejectReason.BAD_KIND),
    ("dtype", 4, RejectReason.BAD_DTYPE),
    ("flags", 0x40, RejectReason.BAD_FLAGS),
    ("count", 0, RejectReason.ABSURD_SIZE),
    ("count", MAX_CHUNKS + 1, RejectReason.ABSURD_SIZE),
    ("index", 4, RejectReason.ABSURD_SIZE),
    ("n_values", 2**31, RejectReason.ABSURD_SIZE),
    ("bitmap_len", 60000, RejectReason.ABSURD_SIZE),
    ("sender", MAX_NODE_ID + 1, RejectReason.BAD_ID),
    ("origin", NO_NODE, RejectReason.BAD_ID),
    ("target", 5000, RejectReason.BAD_ID),
    ("n_values", 4, RejectReason.TRUNCATED),
    ("n_values", 6, RejectReason.TRUNCATED),
])
def test_each_bad_header_field_has_its_reason(field: str, value: int | bytes, reason: RejectReason) -> None:
    frame = sample_frame()
    fields = _header_fields(frame)
    fields[FIELD[field]] = value
    body = _HEADER.pack(*fields) + encode(frame)[HEADER_SIZE:-4]
    result = decode(with_crc(body))
    if field == "n_values" and value == 4:  # one value fewer: the frame is longer than it says
        reason = RejectReason.TRAILING_BYTES
    assert isinstance(result, Rejection)
    assert result.reason == reason, result


def test_length_and_crc_problems_have_their_reasons() -> None:
    data = encode(sample_frame())
    cases = {
        RejectReason.TOO_SHORT: data[:10],
        RejectReason.TRUNCATED: data[:-1],
        RejectReason.TRAILING_BYTES: data + b"\x00",
        RejectReason.BAD_CRC: data[:-5] + bytes([data[-5] ^ 1]) + data[-4:],
    }
    for reason, mutated in cases.items():
        result = decode(mutated)
        assert isinstance(result, Rejection) and result.reason == reason


# ---------------------------------------------------------------- fuzzing: never an exception


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_give_typed_answers(data: bytes) -> None:
    assert_typed(decode(data))


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_behind_a_valid_magic_give_typed_answers(tail: bytes) -> None:
    assert_typed(decode(b"EGRV\x01" + tail, expected_sender=3, job=JOB))


@pytest.mark.slow
@FUZZ
@given(frames(), st.lists(st.integers(0, 10**6), min_size=1, max_size=8))
def test_bit_flips_give_typed_answers(frame: Frame, positions: list[int]) -> None:
    data = bytearray(encode(frame))
    for p in positions:
        data[p % len(data)] ^= 1 << (p % 8)
    assert_typed(decode(bytes(data)))


@pytest.mark.slow
@FUZZ
@given(frames(), st.integers(0, 10**6), st.binary(max_size=40))
def test_truncation_and_extension_give_typed_answers(frame: Frame, cut: int, extra: bytes) -> None:
    data = encode(frame)
    assert_typed(decode(data[: cut % (len(data) + 1)]))
    assert_typed(decode(data + extra))
    assert_typed(decode(with_crc(data[:-4] + extra)))  # longer body, CRC recomputed


HEADER_FIELD_VALUES = st.one_of(
    st.tuples(st.just("magic"), st.binary(min_size=4, max_size=4)),
    st.tuples(st.sampled_from(["version", "kind", "flags", "dtype"]), st.integers(0, 255)),
    st.tuples(st.sampled_from(["job", "round", "index", "count", "model_hash", "n_values"]), u32),
    st.tuples(st.sampled_from(["sender", "origin", "target", "bitmap_len"]), st.integers(0, 65535)),
    st.tuples(st.just("scale"), st.floats(width=32)),
)


@pytest.mark.slow
@FUZZ
@given(frames(), st.lists(HEADER_FIELD_VALUES, min_size=1, max_size=4))
def test_corrupt_header_fields_with_a_good_crc_give_typed_answers(
    frame: Frame, changes: list[tuple[str, int | float | bytes]]
) -> None:
    data = encode(frame)
    fields = list(_HEADER.unpack_from(data))
    for name, value in changes:
        fields[FIELD[name]] = value
    assert_typed(decode(with_crc(_HEADER.pack(*fields) + data[HEADER_SIZE:-4])))


@pytest.mark.slow
@FUZZ
@given(frames(), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6))
def test_corrupt_bodies_with_a_good_crc_give_typed_answers(
    frame: Frame, changes: list[tuple[int, int]]
) -> None:
    body = bytearray(encode(frame)[:-4])
    for position, byte in changes:
        body[position % len(body)] = byte
    assert_typed(decode(with_crc(bytes(body))))


def test_an_int8_scale_that_would_overflow_float32_is_rejected() -> None:
    # Found by hypothesis: 127 * 2.68e36 is inf in float32.
    forged = Frame(Kind.DATA, 0, 0, 0, dtype=DType.I8, scale=2.6793887059314005e36, payload=b"\x7f")
    decoded = decode(encode(forged))
    assert isinstance(decoded, Rejection) and decoded.reason == RejectReason.BAD_VALUES


def test_value_bytes_is_what_a_frame_carries_per_value() -> None:
    for dtype in (DType.F32, DType.F16, DType.I8):
        frame = Frame(Kind.DATA, 0, 0, 0, 0, 1).with_values(np.ones(10, np.float32), dtype)
        assert len(frame.payload) == 10 * value_bytes(dtype)


def test_only_a_data_frame_flagged_audit_is_an_audit_copy() -> None:
    copy = Frame(Kind.DATA, 1, 3, 4, flags=Flag.AUDIT)
    assert copy.is_audit_copy
    assert not Frame(Kind.DATA, 1, 3, 4).is_audit_copy
    assert not Frame(Kind.NACK, 1, 3, 4, flags=Flag.AUDIT).is_audit_copy
    assert decode(encode(copy)).is_audit_copy
