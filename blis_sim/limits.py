"""Documented maxima of every size that reaches compiled code or drives an allocation (docs/reliability.md).

Each is far above any real deployment and far below what would overflow a C integer or exhaust memory, so a
typo (``cpu_bytes_to_use: 10737418240000000000``, ``num_gpu_blocks: 1e18``) is a located input error at load
time instead of an ``OverflowError``, a ``std::bad_alloc`` abort or an hour of allocation. The loaders check
them (offload config, trace header, trace data, workload spec, CLI flags) and :class:`blis_sim.kv.KVConfig`
checks them again for configs built in code.
"""
from __future__ import annotations

#: GPU KV blocks (vLLM's ``num_gpu_blocks``): the compiled block pool holds per-block arrays (~40 bytes each).
#: 2^24 blocks of 16 tokens is 268 M tokens, beyond any single server's KV cache today.
MAX_GPU_BLOCKS = 2**24
#: Tokens per GPU block, per offload chunk (``block_size``) and per hash (``tokens_per_hash``).
MAX_BLOCK_TOKENS = 2**16
#: Bytes (``cpu_bytes_to_use``, an fs tier's ``max_bytes``, ``per_block_bytes``): 1 EiB.
MAX_BYTES = 2**60
#: Transfer threads per direction of one tier (``n_read_threads`` / ``n_write_threads``): one slot each.
MAX_THREADS = 4096
#: A tier's ``saturation_queue_depth`` and the CPU tier's ``store_threshold`` (C ``int`` in the core).
MAX_QUEUE_DEPTH = 2**16
#: Requests of one workload (``num_requests``, ``--num-requests``, a phase's requests): one row each.
MAX_REQUESTS = 10**7
#: Tokens of one request (prompt or output; ``max_num_batched_tokens``): token content is materialised.
MAX_REQUEST_TOKENS = 2**24
#: Concurrent sequences of the scheduler (``--max-num-seqs``).
MAX_NUM_SEQS = 2**16
#: Replicas of a simulated or observed cluster (``--num-instances``): each one holds its own KV cache.
MAX_INSTANCES = 1024


def over(value: int, maximum: int) -> str | None:
    """The reason ``value`` is out of range (``> maximum``), or None."""
    return f"{value} exceeds the maximum {maximum} (docs/reliability.md)" if value > maximum else None
