"""The flat float32 vector shared by every backend: validation and the model hash.

Its own module so that ``backend`` and ``litert_backend`` both import it and neither imports
the other at module level.
"""

from __future__ import annotations

import zlib

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]


def params_hash(params: F32) -> int:
    """Stable 32-bit hash of the parameter bytes (little-endian float32)."""
    return zlib.crc32(np.ascontiguousarray(params, dtype="<f4").tobytes())


def check_flat(flat: npt.ArrayLike, length: int, what: str) -> F32:
    array = np.asarray(flat, dtype=np.float32)
    if array.shape != (length,):
        raise ValueError(f"{what} must be a flat float32 vector of {length}, got {array.shape}")
    return array
