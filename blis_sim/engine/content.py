"""Token content of simulated requests, as the KV cache sees it: chained block hashes.

The cache only needs *which blocks are equal*, so content is built at the level the sharing
happens, all derived from the seed:

* a **prefix group** shares its first ``shared_prefix`` tokens: the group's token stream is made
  once per group and hashed once (:func:`blis_sim.kv.hash_blocks`); a request takes the group's
  hashes for the prefix's *full* blocks (the block straddling the prefix end holds the request's
  own tokens, so it is not shared — as on vLLM) and unique chained hashes for the rest
  (``extend_hashes``: no token array per request);
* an **accumulating session** round r's prompt is ``prefix ‖ in_0 ‖ out_0 ‖ … ‖ in_r``: real
  token streams are built (segment by segment, each segment's ids a function of (seed, session,
  round, in/out)). Round r's own blocks are hashed over its prompt + what it generated. In a
  simulated client (``blis run``) the next round sends back exactly that output, so round r+1 also
  hits round r's decode blocks. In an observe trace (``generated_differs``) the client sent the
  planned output text, not what the server generated, so round r's decode blocks are hashed over
  ids no prompt carries and only its prompt blocks are reused — as on the real server;
* everything else is distinct.

Token ids of a segment are ``key · 2^24 + position`` with a 39-bit key hashed from the seed and the
segment's name: distinct segments never collide in practice, and building one is an ``arange``.
:class:`ContentPlan` holds the per-request structure as numpy columns.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from blis_sim.workload.tokens import key_hash

_KEY_MASK = (1 << 39) - 1


def int_view(values: np.ndarray, dtype: Any = np.int64) -> memoryview:
    """An integer column as a memoryview of its own buffer (no copy when it already has
    ``dtype``): indexing one gives a plain int, as the KV port reads it per request."""
    return np.ascontiguousarray(values, dtype=dtype).data


_U64 = (1 << 64) - 1


def request_seed(base: int, i: int) -> int:
    """Request ``i``'s 64-bit seed for its unique blocks: splitmix64 of ``base + i·φ`` (the
    compiled port's ``_request_seed``, the same bits)."""
    z = (base + i * 0x9E3779B97F4A7C15) & _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    return z ^ (z >> 31)


def segment_tokens(seed: int, *key: str | int, length: int) -> np.ndarray:
    """``length`` int64 token ids unique to (seed, key); prefix-stable in ``length``."""
    base = (key_hash(seed, *key) & _KEY_MASK) << 24
    return np.arange(base, base + max(length, 0), dtype=np.int64)


@dataclass
class ContentPlan:
    """Per-request content structure (arrays indexed like the workload).

    ``group[i]``: index into ``group_names`` (-1: none); ``shared_prefix[i]``: tokens of the group
    prefix at the start of the prompt; ``prev_round[i]``: the previous round of an accumulating
    session (-1: none); ``session[i]``: index into ``session_names`` (-1: not accumulating);
    ``new_input[i]``: tokens this round adds; ``key[i]``: a name unique to the request.
    """

    seed: int
    block_size: int
    prompt_len: np.ndarray
    output_len: np.ndarray
    group: np.ndarray
    shared_prefix: np.ndarray
    session: np.ndarray
    prev_round: np.ndarray
    new_input: np.ndarray
    keys: Sequence[str]
    group_names: list[str]
    session_names: list[str]
    generated_differs: bool = False  # observe traces: the next round carries the planned output
    core: Any = None
    _group_hashes: dict[int, np.ndarray] = field(default_factory=dict)
    _streams: dict[int, np.ndarray] = field(default_factory=dict)
    _seed_base: int = 0
    _root: int = 0
    # the columns read once per request, as memoryviews of the table's own arrays (int64 prompt
    # lengths, int32 codes and shared blocks): indexing one gives a plain int (a numpy array would
    # make a scalar object), and the table's columns are not copied
    _prompt_of: Sequence[int] = field(default_factory=list)
    _session_of: Sequence[int] = field(default_factory=list)
    _group_of: Sequence[int] = field(default_factory=list)
    _blocks_of: Sequence[int] = field(default_factory=list)  # group prefix blocks shared
    _no_prefix: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))

    def __post_init__(self) -> None:
        if self.core is None:
            from blis_sim.kv import core  # the backend chosen at run time (BLIS_PURE_PYTHON)

            self.core = core
        # One 64-bit seed per request for its unique blocks (request_seed): computed when the
        # request is registered, from a seed-derived base that tells traces apart by ``keys``
        self._seed_base = key_hash(self.seed, "requests", *self.keys[:1]) & _U64
        self._root = int(self.core.root_hash(0))
        self._prompt_of = int_view(self.prompt_len)
        self._session_of = int_view(self.session, np.int32)
        self._group_of = int_view(self.group, np.int32)
        self._blocks_of = int_view(self._shared_blocks(), np.int32)

    @property
    def prompt_of(self) -> Sequence[int]:
        """Each request's prompt length (a machine-int array: plain ints when indexed)."""
        return self._prompt_of

    def _shared_blocks(self) -> np.ndarray:
        """Per request: how many of its group prefix's blocks it shares (``prefix_spec``), computed
        for all requests at once: its shared prefix and its prompt in full blocks, and the group's
        hashed prefix (its longest shared prefix, in full blocks), whichever is least; 0 outside
        a group."""
        bs = self.block_size
        grouped = self.group >= 0
        longest = np.zeros(max(len(self.group_names), 1), dtype=np.int64)
        if grouped.any():
            np.maximum.at(longest, self.group[grouped], self.shared_prefix[grouped])
        blocks = np.minimum(np.minimum(self.shared_prefix // bs, self.prompt_len // bs),
                            longest[np.where(grouped, self.group, 0)] // bs)
        return np.where(grouped, blocks, 0)

    # -- groups -------------------------------------------------------------------------------
    def group_prefix(self, g: int) -> np.ndarray:
        """Prefix group ``g``'s hashed prefix (built on first use)."""
        h = self._group_hashes.get(g)
        if h is None:
            longest = int(self.shared_prefix[self.group == g].max())
            toks = segment_tokens(self.seed, "prefix", self.group_names[g], length=longest)
            h = self.core.hash_blocks(toks, self.block_size)
            self._group_hashes[g] = h
        return h

    # -- sessions -----------------------------------------------------------------------------
    def _prefix_tokens(self, i: int) -> np.ndarray:
        g = int(self.group[i])
        if g < 0 or self.shared_prefix[i] <= 0:
            return np.zeros(0, dtype=np.int64)
        return segment_tokens(self.seed, "prefix", self.group_names[g],
                              length=int(self.shared_prefix[i]))

    def _round_stream(self, i: int) -> np.ndarray:
        """Prompt + output tokens of accumulating round ``i`` (cached for the next round)."""
        s = int(self.session[i])
        cached = self._streams.get(i)
        if cached is not None:
            return cached
        p = int(self.prev_round[i])
        head = self._round_stream(p) if p >= 0 else self._prefix_tokens(i)
        name = self.session_names[s]
        new_in = segment_tokens(self.seed, "session-in", name, i, length=int(self.new_input[i]))
        out = segment_tokens(self.seed, "session-out", name, i, length=int(self.output_len[i]))
        stream = np.concatenate([head, new_in, out])
        self._streams[i] = stream
        if p >= 0:
            self._streams.pop(p, None)  # the next round only needs the latest stream
        return stream

    # -- the KV port's call -------------------------------------------------------------------
    def block_hashes(self, i: int) -> np.ndarray:
        """Hashes covering at least the prompt's full blocks (prompt + output for sessions)."""
        spec = self.prefix_spec(i)
        if spec is None:
            return self._session_hashes(i)
        prefix, shared, root, seed = spec
        return self.core.prefixed_hashes(prefix, shared, root, seed,
                                         self._prompt_of[i] // self.block_size)

    def prefix_spec(self, i: int) -> tuple[np.ndarray, int, int, int] | None:
        """``(prefix_hashes, shared_blocks, root, seed)`` of a request that is not a session round:
        its blocks are the group prefix's first ``shared_blocks`` then unique content
        (``core.prefixed_hashes``; the KV cache builds them in place with ``add_prefixed``).
        ``None`` for a session round (:meth:`block_hashes` hashes its token stream)."""
        if self._session_of[i] >= 0:
            return None
        g = self._group_of[i]
        if g < 0:
            return self._no_prefix, 0, self._root, request_seed(self._seed_base, i)
        return self.group_prefix(g), self._blocks_of[i], self._root, request_seed(self._seed_base, i)

    def port_columns(self) -> tuple[Any, ...]:
        """What :meth:`prefix_spec` reads, for a compiled KV port to read in place: per request the
        prompt length (an int64 buffer), session (-1: none), group (-1: none), shared group-prefix
        blocks (int32 buffers); the base of :func:`request_seed`; then the chain's root hash."""
        return (self._prompt_of, self._session_of, self._group_of, self._blocks_of, self._seed_base,
                self._root)

    def _session_hashes(self, i: int) -> np.ndarray:
        stream = self._round_stream(i)
        if self.generated_differs:
            n_out = int(self.output_len[i])
            name = self.session_names[int(self.session[i])]
            stream = np.concatenate([stream[:stream.shape[0] - n_out], segment_tokens(
                self.seed, "session-generated", name, i, length=n_out)])
        return self.core.hash_blocks(stream, self.block_size)

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])
