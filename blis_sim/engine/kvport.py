"""The step loop's view of the KV cache (:class:`blis_sim.kv.KVCache`).

The loop calls, per request index ``i`` (times in µs):

* ``lookup(i, now)`` → ``(gpu_tokens, external_tokens, ...)`` at each admission attempt of a
  waiting request with nothing computed; registers the request's block hashes on first sight;
* ``admit(i, num_new_tokens, now)`` → ``None`` (no room) or ``(num_computed_tokens, ...,
  load_ready_time)``: blocks for the hit, the load and ``num_new_tokens``;
* ``grow(i, num_new_tokens)`` → bool: a scheduled request's next chunk or decode token;
* ``computed(i, now)``: a step completed an offloadable chunk (write-through stores);
* ``preempt(i)``, ``finish(i)``.

:class:`LoopPort` is that contract as a :class:`typing.Protocol` (the step loop's, in ``_loop.pyx`` and
its twin ``_loop_py.py``); :class:`RequestPort` adds what :func:`~blis_sim.engine.simulate.simulate_table`
reads afterwards. Implementations: :class:`KVPort` here, ``blis_sim.kv._core.RequestPort`` (Cython), and
the scheduler tests' block-counting port (``tests/engine_ports.py``). :class:`CacheOps` is what
:class:`KVPort` needs of the cache: :class:`blis_sim.kv.cache.KVCache` and
:class:`blis_sim.kv.compiled.CompiledKVCache` both provide it.

:class:`KVPort` forwards them to the cache, with bound methods for the per-step calls (no extra
Python frame), and records per request what the first admission found (``cached[i] = (device,
host, disk)`` tokens) so that hit-rates can be computed over any window of requests. It also takes a
counter snapshot just before the first request of the comparison window is registered.

:func:`kv_port` picks the port: on the compiled cache, ``blis_sim.kv._core.RequestPort`` (the same
calls and read-outs, the per-admission work done in Cython instead of Python frames); on the pure
cache, :class:`KVPort`.
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from blis_sim.engine.content import ContentPlan

if TYPE_CHECKING:
    from blis_sim.kv.cache import Admission


@runtime_checkable  # tests check each implementation against it
class LoopPort(Protocol):
    """The KV cache as the step loop calls it (the module docstring; times in µs)."""

    def lookup(self, i: int, now: float) -> Sequence[int]:
        """``(gpu_tokens, external_tokens, ...)``: what an admission would find now."""
        ...

    def admit(self, i: int, num_new_tokens: int, now: float) -> Sequence[float] | None:
        """``None`` (no room), or ``(num_computed_tokens, ..., load_ready_time)``."""
        ...

    def grow(self, i: int, num_new_tokens: int) -> bool:
        """Room for ``num_new_tokens`` more of request ``i`` (False: none, the loop preempts)."""
        ...

    def computed(self, i: int, now: float) -> object:
        """A step completed an offloadable chunk of request ``i`` (write-through stores)."""
        ...

    def preempt(self, i: int) -> object: ...

    def finish(self, i: int) -> object: ...


@runtime_checkable  # tests check each implementation against it
class RequestPort(LoopPort, Protocol):
    """A loop port that also records what each request's first admission found."""

    window_snapshot: dict[str, Any] | None  # the cache's counters just before the window's first request

    @property
    def admitted(self) -> np.ndarray:
        """Per request: admitted at least once (bool)."""
        ...

    @property
    def cached(self) -> np.ndarray:
        """Per request: (device, host, disk) tokens found at its first admission (n × 3)."""
        ...


@runtime_checkable  # tests check each implementation against it
class CacheOps(Protocol):
    """What :class:`KVPort` calls on the cache (:mod:`blis_sim.kv`, either backend)."""

    def add_request(self, rid: int, block_hashes: np.ndarray | None, num_prompt_tokens: int) -> object: ...

    def add_prefixed(self, rid: int, prefix: np.ndarray, shared: int, root: int, seed: int,
                     num_prompt_tokens: int) -> object: ...

    def lookup(self, rid: int, now: float) -> Sequence[int]: ...

    def admit(self, rid: int, num_new_tokens: int, now: float) -> Admission | None: ...

    def allocate(self, rid: int, num_new_tokens: int) -> bool: ...

    def computed(self, rid: int, now: float) -> object: ...

    def preempt(self, rid: int) -> object: ...

    def free(self, rid: int) -> object: ...

    def snapshot(self) -> dict[str, Any]: ...


class KVPort:
    """The pure port (a :class:`RequestPort`) over a cache's :class:`CacheOps`."""

    def __init__(self, kv: CacheOps, content: ContentPlan, window_first: int = -1) -> None:
        self.kv = kv
        self.content = content
        self._n = len(content)
        self._prompt_of = content.prompt_of  # shared with the plan (a machine-int array)
        self._registered = bytearray(self._n)
        # per request: admitted yet, and (device, host, disk) tokens at its first admission (flat
        # machine-int arrays: no Python object per request)
        self._admitted = bytearray(self._n)
        self._first = array("i", bytes(12 * self._n))  # int32: a request's tokens fit (the loop checks)
        self.window_first = window_first
        self.window_snapshot: dict[str, Any] | None = None
        # the per-step calls go straight to the cache
        self.grow = kv.allocate
        self.computed = kv.computed
        self.preempt = kv.preempt
        self.finish = kv.free

    def lookup(self, i: int, now: float) -> Sequence[int]:
        if not self._registered[i]:
            if i == self.window_first and self.window_snapshot is None:
                self.window_snapshot = self.kv.snapshot()
            spec = self.content.prefix_spec(i)
            if spec is None:
                self.kv.add_request(i, self.content.block_hashes(i), self._prompt_of[i])
            else:
                prefix, shared, root, seed = spec
                self.kv.add_prefixed(i, prefix, shared, root, seed, self._prompt_of[i])
            self._registered[i] = 1
        return self.kv.lookup(i, now)

    def admit(self, i: int, num_new_tokens: int, now: float) -> Sequence[float] | None:
        res = self.kv.admit(i, num_new_tokens, now)
        if res is not None and not self._admitted[i]:
            self._admitted[i] = 1
            first = self._first
            first[3 * i], first[3 * i + 1], first[3 * i + 2] = res.gpu_tokens, res.host_tokens, res.disk_tokens
        return res

    @property
    def admitted(self) -> np.ndarray:
        """Per request: admitted at least once (bool)."""
        return np.frombuffer(self._admitted, dtype=np.uint8).astype(bool)

    @property
    def cached(self) -> np.ndarray:
        """Per request: (device, host, disk) tokens found at its first admission (n × 3, int32)."""
        return np.frombuffer(self._first, dtype=np.int32).reshape(self._n, 3).copy()


def kv_port(kv: CacheOps, content: ContentPlan, window_first: int = -1) -> RequestPort:
    """The loop's port to ``kv``: compiled on the compiled cache, else :class:`KVPort`."""
    if getattr(kv, "compiled", False):
        from blis_sim.kv import _core  # type: ignore[attr-defined]

        port: RequestPort = _core.RequestPort(kv, content, window_first)
        return port
    return KVPort(kv, content, window_first)
