"""Where a completion's random numbers come from: one request seed, two independent streams (torch-free).

A sampled completion needs randomness in two places: the draft draws its proposals ``d_i ~ q_i`` and the target
draws the acceptance uniforms and the recovered/bonus tokens. Lossless speculative sampling assumes the two are
independent: if both generators started from the same seed, the draft's first draw and the target's first
uniform would be the same number, acceptance would depend on which token was drafted, and the output would no
longer follow the target's distribution.

So a request has one seed (the client's, or a fresh random one), the target's generator is seeded with it (a
client's seed reproduces its completion), and the draft's generator with a digest of it under a domain tag,
which is never the seed itself. The target sends the request seed; the draft derives its own.
"""

from __future__ import annotations

import hashlib
import os

SEED_BITS = 63  # the API accepts seeds in [0, 2^63)
_DRAFT_DOMAIN = b"starsd.draft-proposals.v1\x00"


def request_seed(seed: int | None) -> int:
    """The seed of one completion: the client's, else a fresh random one."""
    if seed is not None:
        return seed
    return int.from_bytes(os.urandom(8), "big") >> (64 - SEED_BITS)


def draft_seed(seed: int) -> int:
    """The draft's seed for a request seeded with ``seed``: a digest under a domain tag, never ``seed`` itself."""
    digest = hashlib.blake2b(_DRAFT_DOMAIN + seed.to_bytes(8, "big"), digest_size=8).digest()
    value = int.from_bytes(digest, "big") >> (64 - SEED_BITS)
    return value if value != seed else value ^ 1
