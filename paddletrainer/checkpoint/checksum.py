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


def crc32(data, value: int = 0) -> int:
    """``zlib.crc32(data, value)``, computed by ISA-L when it is installed."""
    return _crc32(data, value)


def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """The crc32 of ``A + B`` from ``crc1 = crc32(A)``, ``crc2 = crc32(B)`` and ``length2 = len(B)``.

    CRC-32 is affine in its starting value: ``crc32(B, c) = M(c) ^ crc32(B, 0)``, where ``M`` is linear over
    GF(2) and depends only on ``len(B)``: it is the CRC register fed ``8 * len(B)`` zero bits (the pre- and
    post-inversions of ``zlib.crc32`` cancel in the difference). So ``crc32(A + B) = crc32(B, crc1) =
    M(crc1) ^ crc2``. ISA-L computes it when installed; otherwise :func:`_zero_bits` does, in O(log length2).
    """
    if _crc32_combine is not None:
        return _crc32_combine(crc1, crc2, length2)
    return _zero_bits(crc1, 8 * length2) ^ crc2


# The fallback's operators: _POWERS[k] is the register fed 2**k zero bits, as 32 columns (the image of each
# register bit), so applying it is an XOR of the columns of the bits set; each is the previous one squared.
_POLY = 0xEDB88320  # CRC-32's polynomial, bit-reversed (zlib's register shifts right)
_POWERS: list = []


def _apply(columns: list, register: int) -> int:
    out, bit = 0, 0
    while register:
        if register & 1:
            out ^= columns[bit]
        register >>= 1
        bit += 1
    return out


def _zero_bits(register: int, nbits: int) -> int:
    """The CRC-32 register after ``nbits`` zero bits, by the binary expansion of ``nbits``."""
    if not _POWERS:
        one_bit = [(1 << i) >> 1 ^ (_POLY if i == 0 else 0) for i in range(32)]  # shift right, fold bit 0
        _POWERS.append(one_bit)
        for _ in range(63):
            prev = _POWERS[-1]
            _POWERS.append([_apply(prev, col) for col in prev])
    k = 0
    while nbits:
        if nbits & 1:
            register = _apply(_POWERS[k], register)
        nbits >>= 1
        k += 1
    return register
