"""Documented defaults of the simulator's scheduler limits: the one place every caller takes them from
(the CLI, the engine's options, the scheduler, the pytest plugin's server spec and its replays).

A flag, or the trace header's recorded server, wins over these; they apply when neither gives a value.
"""
from __future__ import annotations

#: ``max_num_seqs``: vLLM's default for the online server (``EngineArgs.get_batch_defaults``, in
#: vllm/engine/arg_utils.py, gives 256 for ``UsageContext.OPENAI_API_SERVER`` on GPUs below 70 GiB).
DEFAULT_MAX_NUM_SEQS = 256

#: ``max_num_batched_tokens``: 2048, vLLM's default for the online server (``vllm serve``), which is
#: what the harness observes and replays: ``SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048``
#: (vllm/config/scheduler.py), and ``EngineArgs.get_batch_defaults`` (vllm/engine/arg_utils.py) gives
#: 2048 for ``UsageContext.OPENAI_API_SERVER`` on GPUs below 70 GiB and on CPU at world size 1. The
#: larger values there (8192 for the online server on H100/H200-class GPUs, 8192-16384 for the offline
#: ``LLM`` class) are hardware- or mode-specific: a trace or a flag that needs them says so.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048

#: tokens per GPU block: vLLM's default ``--block-size`` on CUDA (``CacheConfig.block_size``), and the
#: reference's ``--block-size-in-tokens`` default.
DEFAULT_BLOCK_SIZE = 16

#: GPU KV blocks when neither a flag, the trace header nor a known model gives a capacity: the
#: reference's literal ``--total-kv-blocks`` default (docs/reference-formats.md §7.3).
DEFAULT_TOTAL_KV_BLOCKS = 1_000_000

#: the device the model's KV capacity and its roofline are computed for when ``--hardware`` is not given.
DEFAULT_HARDWARE = "H100"
