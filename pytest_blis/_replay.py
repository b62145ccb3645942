"""The simulator's settings for a cell: the server's geometry and offload tiers, the scenario's
scheduler limits, and the latency model fitted on the server's probe."""
from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blis_sim.defaults import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS

if TYPE_CHECKING:
    from blis_sim.engine import EngineOptions
    from pytest_blis._cell import CellContext
    from pytest_blis._server import ServerTarget


def engine_options(target: ServerTarget, *, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                   max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                   latency: Any = None, total_kv_blocks: int | None = None,
                   sequential: bool = False) -> EngineOptions:
    """The simulator's options for replaying ``target``'s traces (``latency``: fitted coefficients;
    ``sequential``: the trace was observed one request at a time)."""
    from blis_sim.engine import EngineOptions

    extra: dict[str, Any] = {}
    if latency is not None:
        extra = {"latency": latency.to_step_model(), "latency_source": "probe fit"}
    return EngineOptions(
        model=target.model, block_size=target.block_size,
        num_gpu_blocks=total_kv_blocks or target.num_gpu_blocks,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        kv_offload=target.offload,
        kv_bytes_per_token=target.offload.kv_bytes_per_token if target.offload is not None else None,
        sequential=sequential, **extra)


def replay_options(ctx: CellContext) -> EngineOptions:
    server = ctx.point.spec.server
    return engine_options(ctx.target, max_num_seqs=server.max_num_seqs,
                          max_num_batched_tokens=server.max_num_batched_tokens, latency=ctx.latency,
                          total_kv_blocks=ctx.options.sim_total_kv_blocks,
                          # A cell at concurrency 1 sent each request when the previous had finished;
                          # replayed open loop, a simulator a few % slower per request would queue
                          # them and the lag would grow along the cell (docs/plugin.md).
                          sequential=ctx.point.spec.sequential)


def fit_latency_model(trace: Any, target: ServerTarget, out: Path, *, step_shape: str = "linear",
                      phases: Collection[str] | None = None, **limits: int) -> Any:
    """Fit the engine's latency model (``step_shape``: linear, or the two-row roofline-fit) on a
    probe trace (only its ``phases`` if given, the rest replayed); the coefficients are written to ``out``."""
    from blis_sim.engine import fit

    name = "probe" if phases is None else "probe's one-at-a-time phases"
    coeffs = fit(trace, engine_options(target, **limits), name=name, shape=step_shape, phases=phases)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(coeffs.model_dump_json(indent=2) + "\n")
    return coeffs
