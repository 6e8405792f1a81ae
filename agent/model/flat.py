"""The flat float32 vector shared by every backend: validation and the model hash.

Its own module so that ``backend`` and ``litert_backend`` both import it and neither imports
the other at module level.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

try:  # ISA-L's CRC-32 is zlib's function (same value), ~4x faster on the 1.6 MB of parameters
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - depends on the optional extra "fast"
    from zlib import crc32 as _crc32

F32 = npt.NDArray[np.float32]


def params_hash(params: F32) -> int:
    """Stable 32-bit hash of the parameter bytes (little-endian float32): the CRC-32 of
    ``params.tobytes()``, computed over the array's own memory (no 1.6 MB copy)."""
    return int(_crc32(np.ascontiguousarray(params, dtype="<f4").data.cast("B")))


def check_flat(flat: npt.ArrayLike, length: int, what: str) -> F32:
    array = np.asarray(flat, dtype=np.float32)
    if array.shape != (length,):
        raise ValueError(f"{what} must be a flat float32 vector of {length}, got {array.shape}")
    return array
