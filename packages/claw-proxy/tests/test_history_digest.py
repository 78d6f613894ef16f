"""The session index's history digest is one hash of the joined keys: the same digest as the
key-by-key hashing that wrote the index files already on disk."""

from __future__ import annotations

import hashlib

from claw_proxy._history import history_digest


def test_the_digest_is_the_key_by_key_digest():
    """Equal to blake2b (16 bytes) updated once per key, for 0, 1 and many keys."""
    for n in (0, 1, 2, 101):
        keys = [hashlib.md5(str(i).encode()).hexdigest() for i in range(n)]
        h = hashlib.blake2b(digest_size=16)
        for k in keys:
            h.update(k.encode("ascii"))
        assert history_digest(keys) == h.hexdigest()
