"""The crc32 of checkpoint files (the index stores one per file, and one per stored tensor).

ISA-L's ``crc32`` (package ``isal``) computes the same CRC-32 as ``zlib.crc32`` (same polynomial, same
chaining) about 4x faster here (14 vs 3.8 GB/s), which keeps checksumming off the critical path of a load
from a fast disk. Without ``isal`` installed, ``zlib`` gives identical values, only slower.

:func:`crc32_combine` gives a file's crc from the crcs of its consecutive pieces, so a writer that needs
both (the index stores the file's and each tensor's) reads every byte once.
"""

from __future__ import annotations

import zlib

try:
    from isal.isal_zlib import crc32 as _crc32
    from isal.isal_zlib import crc32_combine as _crc32_combine
except ImportError:  # optional speed-up: same values
    _crc32 = zlib.crc32
    _crc32_combine = None

_ZEROS = bytes(1 << 20)


def crc32(data, value: int = 0) -> int:
    """``zlib.crc32(data, value)``, computed by ISA-L when it is installed."""
    return _crc32(data, value)



def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """The crc32 of ``A + B`` from ``crc1 = crc32(A)``, ``crc2 = crc32(B)`` and ``length2 = len(B)``.

    CRC-32 is affine in its starting value: ``crc32(B, c) = M(c) ^ crc32(B, 0)`` with ``M`` linear and
    depending only on ``len(B)``, so ``crc32(A + B) = crc32(B, crc1) = M(crc1) ^ crc2``, and
    ``M(c) = crc32(Z, c) ^ crc32(Z, 0)`` for any ``Z`` of ``len(B)`` bytes (zeros here). ISA-L computes
    ``M`` in O(log length2); the zlib fallback runs over ``length2`` zero bytes (slow, same value)."""
    if _crc32_combine is not None:
        return _crc32_combine(crc1, crc2, length2)
    shifted, zero = crc1, 0
    left = length2
    while left > 0:
        step = memoryview(_ZEROS)[: min(left, len(_ZEROS))]
        shifted, zero = zlib.crc32(step, shifted), zlib.crc32(step, zero)
        left -= len(step)
    return shifted ^ zero ^ crc2
