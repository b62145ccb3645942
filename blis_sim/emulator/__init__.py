"""A vLLM-compatible server for tests and the embedded default: ``blis emulate``.

It re-implements vLLM 0.33's behaviour from ``docs/vllm-semantics.md`` (V1 scheduler, prefix
cache with LRU block pool, offloading connector with a CPU tier and fs tiers, Prometheus
counters) and shares no code with the simulator (design D3: nothing here imports ``blis_sim.kv``,
``blis_sim.engine``, ``blis_sim.workload`` or ``blis_sim.observe``; a test enforces it).

Python API::

    from blis_sim.emulator import EmulatorConfig, FaultConfig, start_emulator, spawn_emulator

    cfg = EmulatorConfig(profile="tiny-cpu", block_size=32, num_gpu_blocks=512,
                         enable_prompt_tokens_details=True, kv_offload_config="offload.yaml",
                         metrics_profile="vllm-0.33", faults=FaultConfig(error_rate=0.05))
    with start_emulator(cfg) as emu:          # in-process, own event loop in a thread, port 0
        ...  # emu.url, emu.published(), emu.set_faults(...), emu.restart(), emu.reset_prefix_cache()
    with spawn_emulator(cfg) as proc:         # subprocess on a free port, stopped by its PID
        ...  # proc.url, proc.pid

Modules: ``config`` (EmulatorConfig, FaultConfig, OffloadSpec), ``profiles`` (step-time
profiles), ``tokenizer``, ``gpu_cache`` (block pool), ``offload`` (CPU + secondary tiers),
``scheduler`` (V1 scheduling and counter semantics), ``stats``, ``metrics`` (exposition and
metric profiles), ``engine`` (real-time loop), ``server`` (HTTP routes, SSE, faults), ``http`` (the
small HTTP/1.1 server under them), ``loop`` (uvloop with the stdlib fallback; the precise clock and waits),
``runner`` (start/spawn), ``cli`` (``blis emulate``). Flags, profiles and faults: ``docs/emulator.md``.
"""
from __future__ import annotations

from blis_sim.emulator.config import (
    METRICS_PROFILES,
    EmulatorConfig,
    FaultConfig,
    OffloadSpec,
    TierSpec,
    load_offload_spec,
)
from blis_sim.emulator.profiles import PROFILES, RooflineShape, StepProfile
from blis_sim.emulator.runner import RunningEmulator, SpawnedEmulator, spawn_emulator, start_emulator

__all__ = [
    "METRICS_PROFILES",
    "PROFILES",
    "RooflineShape",
    "EmulatorConfig",
    "FaultConfig",
    "OffloadSpec",
    "RunningEmulator",
    "SpawnedEmulator",
    "StepProfile",
    "TierSpec",
    "load_offload_spec",
    "spawn_emulator",
    "start_emulator",
]
