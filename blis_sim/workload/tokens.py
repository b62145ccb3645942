"""Deterministic token content: the same sharing structure for every consumer (engine run, replay, observe).

Token ids are a pure function of ``(seed, a domain-separated key, position)``: token ``i`` of a key is
``splitmix64(h(seed, key) + i) mod vocab``. So a longer sequence of a key extends the shorter one (a group's
prefix of 1024 tokens starts with its prefix of 512), two keys never share content except by chance, and nothing
depends on generation order. No PRNG state, no Python object per token (numpy vectorised).

API::

    prefix_tokens(seed, group, length)                  # shared by every request of the group
    request_tokens(seed, request_key, length)           # distinct per request (the non-shared suffix)
    session_input_tokens(seed, session_id, round_index, length)   # the new input of one session round
    session_output_tokens(seed, session_id, round_index, length)  # a round's (synthetic) output
    request_input(seed, prefix_group=..., prefix_length=..., suffix_length=..., request_key=...)
    session_round_inputs(seed, session_id=..., new_input_lengths=[...], output_lengths=[...],
                         prefix_group=..., prefix_length=..., accumulate=True)
    new_input_lengths(csv_input_tokens=[...], output_tokens=[...])  # rebuild per-round new lengths from a trace

Rebuilding a trace's sharing structure from its CSV columns alone:

* a row with ``prefix_group != ""`` and ``prefix_length > 0``: ``prefix_tokens(seed, prefix_group, prefix_length)``
  followed by ``input_tokens`` (the CSV suffix) distinct tokens keyed by the row (e.g. its ``request_id``);
* a row without a group: ``input_tokens`` distinct tokens (``prefix_length`` is then 0);
* session rows (``session_id`` set, rounds ``0..n-1``): with accumulated context, round r's input is
  ``prefix ‖ in_0 ‖ out_0 ‖ … ‖ in_(r-1) ‖ out_(r-1) ‖ in_r``; the CSV ``input_tokens`` of round r is everything
  after the prefix, so ``len(in_r) = input_tokens_r − input_tokens_(r−1) − output_tokens_(r−1)``
  (:func:`new_input_lengths`). Without accumulation, round r is ``prefix ‖ in_r``.

``seed`` is the workload seed (``workload_seed`` in the trace header). The vocabulary (128 000 ids, the
reference's ``GenerateRandomTokenIDs`` range) is a parameter.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

try:  # hashlib's blake2b is this very type; importing hashlib also loads OpenSSL,
    # which nothing here needs
    from _blake2 import blake2b
except ImportError:  # an interpreter built without the module: hashlib's own fallback
    from hashlib import blake2b

__all__ = [
    "VOCAB_SIZE", "key_hash", "token_ids", "prefix_tokens", "request_tokens", "session_input_tokens",
    "session_output_tokens", "request_input", "session_round_input", "session_round_inputs", "new_input_lengths",
]

VOCAB_SIZE = 128_000
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def key_hash(seed: int, *key: str | int) -> int:
    """A stable 64-bit hash of (seed, key parts); parts are joined unambiguously (length-prefixed)."""
    h = blake2b(digest_size=8)
    for part in (str(int(seed)), *map(str, key)):
        b = part.encode("utf-8")
        h.update(len(b).to_bytes(4, "little"))
        h.update(b)
    return int.from_bytes(h.digest(), "little")


def token_ids(seed: int, *key: str | int, length: int, vocab: int = VOCAB_SIZE) -> np.ndarray:
    """``length`` token ids in ``[0, vocab)`` for a key, as int64. Prefix-stable in ``length``."""
    if length <= 0:
        return np.zeros(0, dtype=np.int64)
    # uint64 arithmetic wraps by design (splitmix64); array operations do not warn on it
    z = np.arange(length, dtype=np.uint64) * _GOLD + np.uint64(key_hash(seed, *key))
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(vocab)).astype(np.int64)


def prefix_tokens(seed: int, group: str, length: int, vocab: int = VOCAB_SIZE) -> np.ndarray:
    return token_ids(seed, "prefix", group, length=length, vocab=vocab)


def request_tokens(seed: int, request_key: str | int, length: int, vocab: int = VOCAB_SIZE) -> np.ndarray:
    return token_ids(seed, "request", request_key, length=length, vocab=vocab)


def session_input_tokens(seed: int, session_id: str, round_index: int, length: int,
                         vocab: int = VOCAB_SIZE) -> np.ndarray:
    return token_ids(seed, "session-in", session_id, round_index, length=length, vocab=vocab)


def session_output_tokens(seed: int, session_id: str, round_index: int, length: int,
                          vocab: int = VOCAB_SIZE) -> np.ndarray:
    return token_ids(seed, "session-out", session_id, round_index, length=length, vocab=vocab)


def request_input(seed: int, *, prefix_group: str, prefix_length: int, suffix_length: int,
                  request_key: str | int, vocab: int = VOCAB_SIZE) -> np.ndarray:
    """The full input of a non-session request: the group's prefix (if any) then its own suffix."""
    suffix = request_tokens(seed, request_key, suffix_length, vocab)
    if not prefix_group or prefix_length <= 0:
        return suffix
    return np.concatenate([prefix_tokens(seed, prefix_group, prefix_length, vocab), suffix])


def session_round_input(seed: int, *, session_id: str, round_index: int, new_input_length: int,
                        prefix_group: str = "", prefix_length: int = 0,
                        vocab: int = VOCAB_SIZE) -> np.ndarray:
    """The input of one round of a non-accumulating session (a closed-loop user's request): the group
    prefix, then that round's own new tokens (nothing of earlier rounds)."""
    new = session_input_tokens(seed, session_id, round_index, new_input_length, vocab)
    if prefix_group and prefix_length > 0:
        return np.concatenate([prefix_tokens(seed, prefix_group, prefix_length, vocab), new])
    return new


def session_round_inputs(seed: int, *, session_id: str, new_input_lengths: Sequence[int],
                         output_lengths: Sequence[int], prefix_group: str = "", prefix_length: int = 0,
                         accumulate: bool = True, vocab: int = VOCAB_SIZE) -> list[np.ndarray]:
    """The full input of every round of a session (round r uses ``output_lengths[:r]``)."""
    prefix = prefix_tokens(seed, prefix_group, prefix_length, vocab) if prefix_group and prefix_length > 0 \
        else np.zeros(0, dtype=np.int64)
    out: list[np.ndarray] = []
    parts: list[np.ndarray] = [prefix]
    for r, n in enumerate(new_input_lengths):
        new = session_input_tokens(seed, session_id, r, n, vocab)
        if accumulate:
            if r > 0:
                parts.append(session_output_tokens(seed, session_id, r - 1, output_lengths[r - 1], vocab))
            parts.append(new)
            out.append(np.concatenate(parts))
        else:
            out.append(session_round_input(seed, session_id=session_id, round_index=r,
                                           new_input_length=n, prefix_group=prefix_group,
                                           prefix_length=prefix_length, vocab=vocab))
    return out


def new_input_lengths(csv_input_tokens: Sequence[int], output_tokens: Sequence[int]) -> list[int]:
    """Per-round new-input lengths of an accumulating session from its trace rows (rounds in order).

    ``csv_input_tokens`` are the CSV ``input_tokens`` (everything after the prefix); ``output_tokens`` the CSV
    ``output_tokens``. Raises ValueError when the rows are not an accumulating session (a round shorter than the
    previous input plus output), so a caller can fall back to independent rounds.
    """
    out: list[int] = []
    for r, total in enumerate(csv_input_tokens):
        n = total if r == 0 else total - csv_input_tokens[r - 1] - output_tokens[r - 1]
        if n < 0:
            raise ValueError(f"round {r}: input_tokens {total} < previous input {csv_input_tokens[r - 1]} + "
                             f"output {output_tokens[r - 1]}: not an accumulating session")
        out.append(n)
    return out
