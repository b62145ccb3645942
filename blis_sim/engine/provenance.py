"""Provenance of a simulation (design D7): what goes into the header of a trace the engine writes,
and into the MetricsOutput it writes (``sim_provenance``).

``sim_header(outcome, options, mode, base=None)`` → :class:`~blis_sim.formats.TraceHeader` with
the resolved ``kv_offload`` block (INV-13), and in ``pytest_blis``: tool version, KV geometry,
the simulated per-definition hit-rates, offload extensions, and the latency model with its
coefficients (flattened to ``"step.base_us"``-style keys), and the simulator's seed (``sim_seed``).
``base`` (replay) keeps the original header's observation blocks verbatim. ``sim_provenance`` adds
where each setting came from (``settings``: flag, header, model or default).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from blis_sim import __version__

# from the header's own module, not ``blis_sim.formats`` (which re-exports TraceHeader from
# ``formats.trace``): a replay then does not import the trace reader's ITL and Trace models
from blis_sim.engine.settings import SETTINGS
from blis_sim.formats._model import construct
from blis_sim.formats.hitrate import KVHitRate
from blis_sim.formats.results import SimProvenance
from blis_sim.formats.trace_header import KVGeometry, LatencyModelInfo, PytestBlisHeader, SettingSource, TraceHeader

if TYPE_CHECKING:
    from blis_sim.engine.simulate import EngineOptions, SimOutcome


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested dict as ``{"a.b": float}``; sequences as ``a.0``, ``a.1``."""
    out: dict[str, float] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            out.update(flatten({str(i): v for i, v in enumerate(value)}, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def latency_info(options: EngineOptions) -> LatencyModelInfo:
    assert options.latency is not None, "resolve_settings first"
    desc = options.latency.describe()
    name = desc.get("model", "linear")
    if name == "roofline":
        name = f"roofline:{desc.get('hardware')}:tp{desc.get('tp')}"
    # the seed is provenance (``seed`` / ``sim_seed`` beside it), not a coefficient of the model
    coeffs = flatten({k: v for k, v in desc.items() if k != "model"})
    return construct(LatencyModelInfo, name=name, coefficients=coeffs, source=options.latency_source)


def settings_info(options: EngineOptions, latency: LatencyModelInfo) -> dict[str, SettingSource]:
    """Each resolved setting with where it came from (``options.sources``, filled by
    :func:`~blis_sim.engine.settings.resolve_settings`); the offload tiers' values are the
    provenance's ``kv_offload`` block."""
    values: dict[str, int | float | str | None] = {
        "block_size": options.block_size, "num_gpu_blocks": options.num_gpu_blocks,
        "max_num_seqs": options.max_num_seqs, "max_num_batched_tokens": options.max_num_batched_tokens,
        "long_prefill_token_threshold": options.long_prefill_token_threshold,
        "latency_model": latency.name, "kv_bytes_per_token": options.kv_bytes_per_token, "kv_offload": None}
    return {name: construct(SettingSource, value=values[name], source=options.sources[name])
            for name in SETTINGS if name in options.sources}


def sim_provenance(outcome: SimOutcome, options: EngineOptions) -> SimProvenance:
    """The MetricsOutput's ``provenance`` block: the same facts as the trace header's, and where
    each setting came from."""
    latency = latency_info(options)
    return construct(
        SimProvenance,
        tool_version=__version__, latency_model=latency, seed=int(options.seed),
        kv_geometry=construct(KVGeometry, block_size=outcome.block_size, num_gpu_blocks=outcome.num_gpu_blocks),
        kv_offload=outcome.offload.to_header() if outcome.offload is not None else None,
        settings=settings_info(options, latency))


def sim_header(outcome: SimOutcome, options: EngineOptions, *, mode: Literal["generated", "replayed"],
               base: TraceHeader | None = None,
               workload_seed: int | None = None, workload_spec: str = "",
               accumulate: bool = False) -> TraceHeader:
    ext = construct(
        PytestBlisHeader,
        tool_version=__version__,
        kv_geometry=construct(KVGeometry, block_size=outcome.block_size, num_gpu_blocks=outcome.num_gpu_blocks),
        kv_hit_rates=[construct(KVHitRate, **e) for e in outcome.hit_rates],
        offload=outcome.offload.extensions() if outcome.offload is not None else None,
        latency_model=latency_info(options), sim_seed=int(options.seed),
    )
    kv_offload = outcome.offload.to_header() if outcome.offload is not None else None
    if base is not None:
        return base.model_copy(update={
            "mode": mode, "time_unit": "microseconds", "kv_offload": kv_offload,
            "pytest_blis": _merge(base.pytest_blis, ext)})
    return construct(TraceHeader, mode=mode, time_unit="microseconds", workload_seed=workload_seed,
                     workload_spec=workload_spec,
                     session_context_growth="accumulate" if accumulate else "",
                     kv_offload=kv_offload, pytest_blis=ext)


def _merge(original: PytestBlisHeader | None, ours: PytestBlisHeader) -> PytestBlisHeader:
    """A replay keeps the observation verbatim (server versions, observed hit-rates, scrape,
    phases) and states its own geometry, offload extensions and latency model."""
    if original is None:
        return ours.model_copy(update={"kv_hit_rates": []})
    return original.model_copy(update={
        "tool_version": ours.tool_version, "kv_geometry": ours.kv_geometry,
        "offload": ours.offload, "latency_model": ours.latency_model, "sim_seed": ours.sim_seed})
