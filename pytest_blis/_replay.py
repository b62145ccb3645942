"""The simulator's settings for a cell: the server's geometry and offload tiers, the scenario's
scheduler limits, and the latency model fitted on the server's probe. These are the cell's flags;
the replay resolves the rest against the trace header, then the model, then the documented defaults
(:func:`blis_sim.engine.settings.resolve_settings`, the one place every caller resolves them)."""
from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blis_sim.engine import EngineOptions, fit

if TYPE_CHECKING:
    from blis_sim.engine import LatencyCoefficients
    from blis_sim.formats import Trace
    from pytest_blis._cell import CellContext
    from pytest_blis._server import ServerTarget


def engine_options(target: ServerTarget, *, max_num_seqs: int | None = None,
                   max_num_batched_tokens: int | None = None,
                   latency: LatencyCoefficients | None = None, total_kv_blocks: int | None = None,
                   sequential: bool = False) -> EngineOptions:
    """The simulator's options for replaying ``target``'s traces (``latency``: fitted coefficients;
    ``sequential``: the trace was observed one request at a time). ``None``: not set by the cell,
    resolved on replay (blis_sim/defaults.py)."""
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
    given = server.model_fields_set  # a limit the scenario left out is the documented default's
    return engine_options(ctx.target,
                          max_num_seqs=server.max_num_seqs if "max_num_seqs" in given else None,
                          max_num_batched_tokens=(server.max_num_batched_tokens
                                                  if "max_num_batched_tokens" in given else None),
                          latency=ctx.latency, total_kv_blocks=ctx.options.sim_total_kv_blocks,
                          # A cell at concurrency 1 sent each request when the previous had finished;
                          # replayed open loop, a simulator a few % slower per request would queue
                          # them and the lag would grow along the cell (docs/plugin.md).
                          sequential=ctx.point.spec.sequential)


def fit_latency_model(trace: Trace, target: ServerTarget, out: Path, *, step_shape: str = "linear",
                      phases: Collection[str] | None = None, max_num_seqs: int | None = None,
                      max_num_batched_tokens: int | None = None) -> LatencyCoefficients:
    """Fit the engine's latency model (``step_shape``: linear, or the two-row roofline-fit) on a
    probe trace (only its ``phases`` if given, the rest replayed); the coefficients are written to ``out``."""
    name = "probe" if phases is None else "probe's one-at-a-time phases"
    options = engine_options(target, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    coeffs = fit(trace, options, name=name, shape=step_shape, phases=phases)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(coeffs.model_dump_json(indent=2) + "\n")
    return coeffs
