"""Offload tier service times: each tier's effective bandwidth and per-transfer cost from the server's
counters, and the simulated service time of each tier against the real one.

API::

    fits = derive_tier_service([header.pytest_blis.tier_io, ...])   # one TierIO list per counter window
    fits[("1:fs", "read")]           # TierFit(bandwidth_Bps, fixed_cost_s, method, windows, ...)
    rows, notes = compare_tier_service(observed_tier_io, simulated_tier_io, tolerance=0.10)
    text = offload_config_text(resolved_kv_offload_block, fits)   # a `kv_offload:` YAML replay accepts

Each (tier, direction) has, per window, bytes ``B``, seconds ``T`` (vLLM sums each transfer's own
duration: device time for GPU <-> CPU, per-thread I/O time for fs) and, where the server counts them,
transfers ``n``. The model is the simulator's station without queueing: ``T = n·c + B / bw``.

* ``lstsq``: two or more windows with transfer counts whose mean transfer sizes ``B/n`` differ by at
  least :data:`MIN_SIZE_SPREAD`: a non-negative least-squares line ``T/n = c + (B/n) / bw`` over the
  windows gives the per-transfer fixed cost ``c`` and the bandwidth ``bw``.
* ``bandwidth-only``: otherwise (one window, no counts, or transfers all of one size):
  ``bw = ΣB / ΣT``, an *effective* bandwidth with any per-transfer cost folded in; ``c`` is unknown.
  One window gives one equation: vLLM's size histograms give per-transfer sizes but not per-transfer
  times, so they cannot separate ``c`` from ``bw``.

The verdict compares total service seconds over the window, per tier and direction:
``|sim − real| / real <= tolerance`` (default :data:`DEFAULT_TIER_SERVICE_TOLERANCE`).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from blis_sim.formats.hitrate import PRIMARY_TIER

DEFAULT_TIER_SERVICE_TOLERANCE = 0.10
#: Smallest ratio between the largest and smallest mean transfer size over the windows for a fit.
MIN_SIZE_SPREAD = 1.10
DIRECTIONS = ("read", "write")


@dataclass(frozen=True)
class TierWindow:
    """One direction of one tier over one counter window."""

    bytes: float
    seconds: float
    jobs: int | None = None


@dataclass(frozen=True)
class TierFit:
    tier: str
    direction: str  # read (towards the GPU) | write
    bandwidth_Bps: float  # bytes per second
    fixed_cost_s: float | None  # per transfer; None when not identifiable (bandwidth-only)
    method: str  # "lstsq" | "bandwidth-only"
    windows: int
    bytes: float
    seconds: float
    jobs: int | None

    @property
    def effective_bandwidth_Bps(self) -> float:
        return self.bytes / self.seconds


def _windows(tier_io_lists: Iterable[Sequence[Any]]) -> dict[tuple[str, str], list[TierWindow]]:
    out: dict[tuple[str, str], list[TierWindow]] = {}
    for tier_io in tier_io_lists:
        for t in tier_io or ():
            for d in DIRECTIONS:
                b, s = float(getattr(t, f"{d}_bytes")), float(getattr(t, f"{d}_time_s"))
                if b > 0 and s > 0:
                    out.setdefault((t.tier, d), []).append(TierWindow(b, s, getattr(t, f"{d}_jobs", None)))
    return out


def fit_windows(tier: str, direction: str, windows: Sequence[TierWindow]) -> TierFit:
    """The fit of one (tier, direction) over its windows (see the module docstring)."""
    total_b = sum(w.bytes for w in windows)
    total_s = sum(w.seconds for w in windows)
    counted = [w for w in windows if w.jobs]
    jobs = sum(w.jobs or 0 for w in counted) if len(counted) == len(windows) else None
    base: dict[str, Any] = dict(tier=tier, direction=direction, windows=len(windows), bytes=total_b,
                                seconds=total_s, jobs=jobs)
    if jobs is not None and len(windows) >= 2:
        sizes = [w.bytes / w.jobs for w in counted]  # type: ignore[operator]
        if max(sizes) >= MIN_SIZE_SPREAD * min(sizes):
            from scipy.optimize import nnls

            a = np.array([[1.0, s] for s in sizes])
            y = np.array([w.seconds / w.jobs for w in counted])  # type: ignore[operator]
            (fixed, per_byte), _residual = nnls(a, y)
            if per_byte > 0:
                return TierFit(bandwidth_Bps=1.0 / per_byte, fixed_cost_s=float(fixed), method="lstsq", **base)
    return TierFit(bandwidth_Bps=total_b / total_s, fixed_cost_s=None, method="bandwidth-only", **base)


def derive_tier_service(tier_io_lists: Iterable[Sequence[Any]]) -> dict[tuple[str, str], TierFit]:
    """Every (tier, direction) with bytes and seconds in some window, fitted over all windows."""
    return {key: fit_windows(key[0], key[1], ws) for key, ws in sorted(_windows(tier_io_lists).items())}


@dataclass(frozen=True)
class TierServiceRow:
    tier: str
    direction: str
    real_seconds: float
    sim_seconds: float
    rel_error: float
    tolerance: float
    within: bool
    real_bytes: int
    sim_bytes: int
    real_bandwidth_Bps: float
    sim_bandwidth_Bps: float | None
    real_jobs: int | None
    sim_jobs: int | None


def compare_tier_service(observed: Sequence[Any], simulated: Sequence[Any], tolerance: float
                         ) -> tuple[list[TierServiceRow], list[str]]:
    """Simulated against real service seconds per tier and direction, where the server timed some
    transfer; notes say what could not be compared and why."""
    sim = {t.tier: t for t in simulated or ()}
    rows: list[TierServiceRow] = []
    notes: list[str] = []
    for t in observed or ():
        for d in DIRECTIONS:
            rb, rs = int(getattr(t, f"{d}_bytes")), float(getattr(t, f"{d}_time_s"))
            if rb <= 0:
                continue
            name = f"{t.tier}/{d}"
            if rs <= 0:
                notes.append(f"tier_service[{name}]: the server moved {rb} bytes but recorded no transfer time "
                             "(its offload worker reports none): not compared")
                continue
            s = sim.get(t.tier)
            if s is None:
                notes.append(f"tier_service[{name}]: the simulated metrics carry no tier {t.tier!r}: not compared")
                continue
            sb, ss = int(getattr(s, f"{d}_bytes")), float(getattr(s, f"{d}_time_s"))
            err = abs(ss - rs) / rs
            rows.append(TierServiceRow(
                tier=t.tier, direction=d, real_seconds=rs, sim_seconds=ss, rel_error=err, tolerance=tolerance,
                within=err <= tolerance, real_bytes=rb, sim_bytes=sb, real_bandwidth_Bps=rb / rs,
                sim_bandwidth_Bps=sb / ss if ss > 0 else None, real_jobs=getattr(t, f"{d}_jobs", None),
                sim_jobs=getattr(s, f"{d}_jobs", None)))
            if rb and abs(sb - rb) / rb > tolerance:
                notes.append(f"tier_service[{name}]: simulated bytes {sb} vs real {rb} "
                             f"({100 * (sb - rb) / rb:+.1f} %): the service-time gap is partly a traffic gap "
                             "(see the hit-rate verdicts), not only the tier's bandwidth")
    return rows, notes


# ------------------------------------------------------------------------- an offload config with the fits


def fitted_tiers(block: Any, fits: Mapping[tuple[str, str], TierFit]) -> list[dict[str, Any]]:
    """The ``secondary_tiers`` of a resolved ``kv_offload`` header block with each fitted direction's
    bandwidth (bytes/µs) and, from a least-squares fit, its per-transfer cost as ``base_latency`` (µs)."""
    tiers = []
    for i, t in enumerate(getattr(block, "secondary_tiers", None) or ()):
        label = f"{i + 1}:{t.type}"
        out: dict[str, Any] = {"type": t.type, "root_dir": t.root_dir, "n_read_threads": t.n_read_threads,
                               "n_write_threads": t.n_write_threads, "direct_io": t.direct_io,
                               "read_bandwidth": t.read_bandwidth, "write_bandwidth": t.write_bandwidth,
                               "base_latency": t.base_latency}
        if t.locality:
            out["locality"] = t.locality
        latencies = []
        for d in DIRECTIONS:
            f = fits.get((label, d))
            if f is not None:
                out[f"{d}_bandwidth"] = f.bandwidth_Bps / 1e6
                if f.fixed_cost_s is not None:
                    latencies.append(f.fixed_cost_s * 1e6)
                elif f.method == "bandwidth-only":
                    latencies.append(0.0)  # the effective bandwidth already holds the fixed cost
        if latencies:
            out["base_latency"] = sum(latencies) / len(latencies)  # one latency per tier in the config
        tiers.append(out)
    return tiers


def fitted_link(fits: Mapping[tuple[str, str], TierFit]) -> dict[str, float] | None:
    """The offload config's ``cpu_link`` from the primary tier's fits (read = CPU -> GPU loads, write = GPU ->
    CPU stores), bytes/µs and µs; None unless both directions were fitted."""
    read, write = fits.get((PRIMARY_TIER, "read")), fits.get((PRIMARY_TIER, "write"))
    if read is None or write is None:
        return None
    costs = [f.fixed_cost_s * 1e6 for f in (read, write) if f.fixed_cost_s is not None]
    return {"read_bandwidth": read.bandwidth_Bps / 1e6, "write_bandwidth": write.bandwidth_Bps / 1e6,
            "base_latency": sum(costs) / len(costs) if costs else 0.0}


def offload_config_text(block: Any, fits: Mapping[tuple[str, str], TierFit], *, source: str = "") -> str:
    """A ``kv_offload:`` YAML (the ``--kv-offload-config`` format) of ``block`` (the resolved config a
    replay recorded) with the fitted bandwidths: each secondary tier's, and the CPU <-> GPU link's as
    ``cpu_link`` when both its directions were fitted. Explicit bandwidths replace the tier's device class
    (its queue-depth ramp and jitter are not carried over); ``max_bytes`` and ``store_threshold``, which
    the recorded block does not hold, are not written."""
    data: dict[str, Any] = {"cpu_bytes_to_use": block.cpu_bytes_to_use, "blocks_per_chunk": block.blocks_per_chunk,
                            "eviction_policy": block.eviction_policy or "lru",
                            "offload_prompt_only": block.offload_prompt_only}
    link = fitted_link(fits)
    if link is not None:
        data["cpu_link"] = link
    tiers = fitted_tiers(block, fits)
    if tiers:
        data["secondary_tiers"] = tiers
    head = ["# Offload config with tier bandwidths fitted by `blis calibrate` (bytes/us, us)."]
    if source:
        head.append(f"# From: {source}")
    for (tier, d), f in sorted(fits.items()):
        cost = "" if f.fixed_cost_s is None else f", {f.fixed_cost_s * 1e6:.3f} us per transfer"
        head.append(f"# {tier} {d}: {f.bandwidth_Bps / 1e6:.3f} bytes/us{cost} ({f.method}, {f.windows} "
                    f"window(s))")
    return "\n".join(head) + "\n" + yaml.safe_dump({"kv_offload": data}, sort_keys=False)
