"""The compiled :class:`blis_sim.kv.KVCache`: the Cython request layer (``_core.CacheCore``, the
twin of :class:`blis_sim.kv.cache.KVCache`) with the read-outs both share. Importing this module
needs the built extension."""
from __future__ import annotations

from blis_sim.kv import KVCache, _core  # type: ignore[attr-defined]
from blis_sim.kv.cache import Readouts


class CompiledKVCache(_core.CacheCore, Readouts):
    """The tiered KV cache on the Cython core (see :mod:`blis_sim.kv` for the API)."""


KVCache.register(CompiledKVCache)  # isinstance(cache, KVCache) whichever backend built it
