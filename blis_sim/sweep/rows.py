"""One sweep point's table row, from the simulation's outcome.

Columns, in order: ``point``, the axes (as written in the sweep file), then the figures —
``completed_requests``, ``injected_requests``, ``dropped_unservable``, ``still_queued``,
``still_running``, ``duration_s``, ``responses_per_sec``, ``tokens_per_sec``, ``preemption_count``,
``ttft_{mean,p50,p90,p99}_ms``, ``e2e_…``, ``itl_…`` (ITL over every inter-token gap) — then per
hit-rate definition and tier of the MetricsOutput's ``kv_hit_rates`` (design D2)
``hit_rate.<definition>[.<tier>]``, ``hits.…``, ``queries.…``; last ``provenance`` (the
MetricsOutput's provenance block as JSON: tool version, latency model and coefficients, seed, KV
geometry, resolved offload config) and ``key`` (the point's digest, for resume).
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from blis_sim.engine.outputs import percentile, weighted_percentiles
from blis_sim.formats._model import to_go

FIGURES = ("completed_requests", "injected_requests", "dropped_unservable", "still_queued",
           "still_running", "duration_s", "responses_per_sec", "tokens_per_sec", "preemption_count")
LATENCIES = ("ttft", "e2e", "itl")
STATS = ("mean", "p50", "p90", "p99")


def hit_rate_name(definition: str, tier: str | None) -> str:
    return definition + (f".{tier}" if tier else "")


def row_of(out: Any, task: Any) -> dict[str, Any]:
    """The point's figures (every column but ``point`` and the axes)."""
    m = out.metrics(include_requests=False)
    o = out.outcome
    done = o.completed
    row: dict[str, Any] = {}
    row.update(completed_requests=m.completed_requests, injected_requests=m.injected_requests,
               dropped_unservable=m.dropped_unservable, still_queued=m.still_queued,
               still_running=m.still_running, duration_s=m.vllm_estimated_duration_s,
               responses_per_sec=m.responses_per_sec, tokens_per_sec=m.tokens_per_sec,
               preemption_count=m.preemption_count)
    ttft = o.ttft_us[done] / 1e3
    e2e = o.e2e_us[done] / 1e3
    itl_v, itl_w = o.loop.itl_values / 1e3, o.loop.itl_weights
    row.update(ttft_mean_ms=m.ttft_mean_ms, ttft_p50_ms=percentile(ttft, 50),
               ttft_p90_ms=m.ttft_p90_ms, ttft_p99_ms=m.ttft_p99_ms,
               e2e_mean_ms=m.e2e_mean_ms, e2e_p50_ms=percentile(e2e, 50),
               e2e_p90_ms=m.e2e_p90_ms, e2e_p99_ms=m.e2e_p99_ms,
               itl_mean_ms=m.itl_mean_ms, itl_p50_ms=weighted_percentiles(itl_v, itl_w, (50,))[0]
               if itl_w.size else 0.0,
               itl_p90_ms=m.itl_p90_ms, itl_p99_ms=m.itl_p99_ms)
    for e in m.kv_hit_rates or []:
        name = hit_rate_name(e.definition, e.tier)
        row[f"hit_rate.{name}"] = e.hit_rate
        row[f"hits.{name}"] = e.hits
        row[f"queries.{name}"] = e.queries
    row["provenance"] = json.dumps(to_go(m.provenance), sort_keys=True, separators=(",", ":"))
    row["key"] = task.key
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()}


def columns(rows: list[dict[str, Any]], axes: list[str]) -> list[str]:
    """The table's columns: point, axes, figures, hit-rates (in first-seen order), provenance, key."""
    head = ["point", *axes, *FIGURES, *(f"{lat}_{s}_ms" for lat in LATENCIES for s in STATS)]
    rest: list[str] = []
    for r in rows:
        for k in r:
            if k not in head and k not in rest and k not in ("provenance", "key"):
                rest.append(k)
    hit = [k for k in rest if k.startswith("hit_rate.")]
    counts = [k for k in rest if not k.startswith("hit_rate.")]
    return head + hit + counts + ["provenance", "key"]
