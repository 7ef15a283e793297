"""A seeded bijection on [0, n), evaluated a batch of positions at a time.

The sampler needs "position i of epoch e -> sample index" with every index exactly once per
epoch. `torch.randperm(n)` gives that at 8 bytes per sample and O(n) time each epoch: ~2 GB per
rank for the ~244 M windows of a 1 TB corpus at seq 2048. A Feistel network is a bijection by
construction whatever its round function, so a keyed hash for that function is enough. Its
domain here is [0, a*b) with a = ceil(sqrt(n)), b = ceil(n/a) (rounds add modulo a and b
instead of xoring bit halves), and cycle-walking (apply it again while the value is >= n)
restricts it to [0, n), still a bijection (Black & Rogaway, "Ciphers with Arbitrary Finite
Domains", 2002). a*b - n < a, so a value walks with probability < 1/sqrt(n): one pass per
batch nearly always, where the next power of two (up to 2n) made a batch of 16 take ~4.

Not a cryptographic cipher, and it needs not be: the rounds only have to scatter neighbouring
positions over the whole range, which the tests check. Pure numpy, no torch: it is math.

The output for a given (n, key) is part of the checkpoint contract: a run resumed mid-epoch
recomputes the rest of the epoch's order from (seed, epoch, consumed), so changing the rounds
or the hash breaks exactly-once for runs resumed across the change (tests pin the values).
"""

from __future__ import annotations

import functools
import math

import numpy as np

ROUNDS = 6  # Feistel rounds (each updates one half); Luby-Rackoff needs 4 for a strong PRP
_U64 = np.uint64
_M1, _M2 = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)  # splitmix64's finalizer
_S27, _S30, _S31, _S32 = _U64(27), _U64(30), _U64(31), _U64(32)
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: decorrelates successive round keys


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every input bit flips about half the output bits. On arrays,
    uint64 products wrap mod 2**64 silently, as wanted (numpy warns only for scalars)."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def epoch_key(seed: int, epoch: int) -> int:
    """The key of one epoch's order: different per (seed, epoch), the same on every rank."""
    z = np.array([(seed * 1_000_003 + epoch) & (2**64 - 1)], dtype=_U64)
    return int(_mix(z)[0])


@functools.lru_cache(maxsize=16)
def round_keys(key: int) -> tuple[tuple[np.uint64, np.uint64], ...]:
    """(xor key, odd multiplier) per round, from one key (splitmix64's sequence); cached: an
    epoch asks for the same key once per batch."""
    steps = np.arange(1, 2 * ROUNDS + 1, dtype=_U64) * _U64(_GOLDEN) + _U64(key)  # wraps
    k = _mix(steps)
    return tuple((k[2 * r], k[2 * r + 1] | _U64(1)) for r in range(ROUNDS))


def _feistel(x: np.ndarray, a: int, b: int, keys: tuple) -> np.ndarray:
    """One pass of the network on [0, a*b): a bijection of that range.

    x = hi * b + lo with hi in [0, a), lo in [0, b); each round adds a hash of one half to
    the other modulo its size, which a subtraction undoes, so any a, b work (a generalized
    Feistel network; Black & Rogaway call it FE2) and a*b can sit just above n. The hash is
    multiply-shift (Dietzfelbinger): the top 32 bits of (v ^ k) * m depend on every bit of v,
    in three array operations, which is what a small batch's cost is made of.
    """
    a64, b64 = _U64(a), _U64(b)
    hi, lo = x // b64, x % b64
    for r, (k, m) in enumerate(keys):
        if r % 2 == 0:
            hi = (hi + (((lo ^ k) * m) >> _S32)) % a64
        else:
            lo = (lo + (((hi ^ k) * m) >> _S32)) % b64
    return hi * b64 + lo


def domain(n: int) -> tuple[int, int]:
    """(a, b) with a*b >= n and a*b - n < a ~ sqrt(n): cycle-walking is rare."""
    a = math.isqrt(n - 1) + 1  # ceil(sqrt(n))
    return a, -(-n // a)


def permute(positions: np.ndarray, n: int, key: int) -> np.ndarray:
    """The images of `positions` (each in [0, n)) under the key's bijection on [0, n).

    Memory and time are O(len(positions)), independent of n.
    """
    pos = np.asarray(positions, dtype=_U64)
    if n <= 1 or pos.size == 0:
        return pos.astype(np.int64)
    if not 0 < n <= 2**62:
        raise ValueError(f"permute: n = {n} is outside [1, 2**62]")
    a, b = domain(n)
    keys = round_keys(key)
    out = _feistel(pos, a, b, keys)
    walk = out >= _U64(n)
    while walk.any():  # cycle-walking: terminates, the start itself is < n on its cycle
        out[walk] = _feistel(out[walk], a, b, keys)
        walk[walk] = out[walk] >= _U64(n)
    return out.astype(np.int64)
