"""`blis run`, `blis replay`, `blis fit`: argument parsing and file I/O around the engine's library API.

``register(subparsers)`` adds the three subcommands. Shared simulator flags are the reference's
(``--total-kv-blocks``, ``--block-size-in-tokens``, ``--max-num-seqs``, ``--max-num-batched-tokens``,
``--long-prefill-token-threshold``, ``--latency-model``, ``--seed``, ``--horizon``,
``--kv-offload-config``, ``--defaults-filepath``) plus ours: ``--latency-coefficients FILE`` (the
linear model's YAML/JSON, e.g. written by ``blis fit``), ``--model-config config.json``,
``--hardware``, ``--tp`` (roofline and KV sizing). Outputs: ``--results-path`` (SimResult JSON),
``--metrics-path`` (MetricsOutput JSON), ``--trace-output PREFIX`` (``PREFIX.yaml`` +
``PREFIX.csv``). stdout gets the MetricsOutput without ``requests`` and ``cache_hit_rate`` (as the
reference prints it). Errors: one line and exit code 2 (blis_sim.cli handles BlisError).

Flags are honoured or refused: ``--latency-coefficients`` with ``--latency-model roofline`` is an
error; on ``blis fit`` it is a start, as ``--initial-coefficients`` is; an observed trace
replayed or fitted on default KV size / batch limits gets one stderr warning naming them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blis_sim import limits
from blis_sim.defaults import DEFAULT_HARDWARE, DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
from blis_sim.engine.coefficients import dump_coefficients, load_coefficients
from blis_sim.engine.fitting import SEARCH_EVALUATIONS, evaluate, fit
from blis_sim.engine.latency import StepModel, get_hardware, roofline
from blis_sim.engine.models import geometry_for
from blis_sim.engine.prior import resolve_prior
from blis_sim.engine.replay_trace import replay_outcome
from blis_sim.engine.run_spec import run_outcome
from blis_sim.engine.settings import OffloadFlags, resolve_settings, with_flags
from blis_sim.engine.simulate import EngineOptions
from blis_sim.errors import ConfigError, InputError, UsageError
from blis_sim.formats import metrics_output_text, write_trace
from blis_sim.formats.trace_columns import ColumnarTrace, load_trace_columns
from blis_sim.formats.workload import load_workload_spec

if TYPE_CHECKING:
    from blis_sim.cli import Subparsers
    from blis_sim.engine.outputs import SimulatedOutputs
    from blis_sim.formats import Trace, TraceHeader
    from blis_sim.routing import RoutingSpec


def add_sim_flags(p: argparse.ArgumentParser) -> None:
    """The simulator's flags, shared by replay, run, fit and ``blis sweep``."""
    g = p.add_argument_group("simulator")
    g.add_argument("--model", default="", help="model name (KV size per token for known models)")
    g.add_argument("--model-config", default=None,
                   help="a local Hugging Face config.json (KV size, roofline, KV capacity)")
    g.add_argument("--total-kv-blocks", type=int, default=None,
                   help="GPU KV blocks (default: the trace's recorded server geometry, else the "
                        "model's capacity on --hardware, else 1000000)")
    g.add_argument("--block-size-in-tokens", type=int, default=None,
                   help="tokens per GPU block (default: the trace's, else 16)")
    g.add_argument("--max-num-seqs", type=int, default=None,
                   help=f"default: the trace header's server.max_num_seqs, else {DEFAULT_MAX_NUM_SEQS}")
    g.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help=f"default {DEFAULT_MAX_NUM_BATCHED_TOKENS}")
    g.add_argument("--long-prefill-token-threshold", type=int, default=None, help="default 0 (off)")
    g.add_argument("--latency-model", choices=("linear", "roofline"), default="linear",
                   help="linear (coefficients from --latency-coefficients, else the bundled "
                        "default) or roofline (--model-config/--model, --hardware, --tp)")
    g.add_argument("--latency-coefficients", default=None,
                   help="fitted model coefficients (linear or roofline-fit), YAML or JSON (e.g. from `blis fit`); not "
                        "with --latency-model roofline")
    g.add_argument("--hardware", default=None,
                   help=f"H100 | H200 | A100 | L40S (roofline and KV sizing: default "
                        f"{DEFAULT_HARDWARE}; blis fit: the device of its physics prior, none "
                        "if not given)")
    g.add_argument("--tp", type=int, default=1, help="tensor parallel degree")
    g.add_argument("--seed", type=int, default=42, help="seed of synthetic token content and jitter")
    g.add_argument("--horizon", type=float, default=None, help="stop at this simulated time, µs")
    g.add_argument("--kv-offload-config", default=None,
                   help="offload tiers: our YAML (kv_offload:), or what vllm serve takes as --kv-transfer-config "
                        "(a JSON or YAML file, or the JSON string itself)")
    g.add_argument("--kv-offloading-size", type=float, default=None, metavar="GIB",
                   help="vllm serve's --kv-offloading-size: a CPU tier of this many GiB (total over TP ranks)")
    g.add_argument("--kv-offloading-backend", choices=("native", "lmcache"), default=None,
                   help="vllm serve's --kv-offloading-backend (only native is modelled)")
    g.add_argument("--defaults-filepath", default=None,
                   help="a defaults.yaml with kv_offload_devices (device classes)")


def _output_flags(p: argparse.ArgumentParser, *, trace_output: bool = True) -> None:
    p.add_argument("--results-path", default=None, help="write the SimResult JSON here")
    p.add_argument("--metrics-path", default=None, help="write the MetricsOutput JSON here")
    if trace_output:
        p.add_argument("--trace-output", default=None,
                       help="write the simulated trace as PREFIX.yaml + PREFIX.csv")
        p.add_argument("--blis-compatible", action="store_true",
                       help="leave our pytest_blis header block out of --trace-output")


def add_cluster_flags(p: argparse.ArgumentParser, *, default_policy: str) -> None:
    """The reference's cluster flags (docs/cluster.md §2): replicas, the routing policy and its scorers."""
    from blis_sim.routing import POLICIES

    g = p.add_argument_group("cluster")
    g.add_argument("--num-instances", type=int, default=None,
                   help="replicas, each with its own KV cache (default: the trace's cluster, else 1)")
    g.add_argument("--routing-policy", choices=POLICIES, default=default_policy,
                   help=f"how requests are routed to replicas (default {default_policy}"
                        + (": the trace's replica column)" if default_policy == "recorded" else ")"))
    g.add_argument("--routing-scorers", default=None,
                   help="weighted policy: name:weight,... over prefix-affinity and queue-depth "
                        "(e.g. prefix-affinity:3,queue-depth:2)")


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("run", help="simulate a workload spec",
                              description="Generate a workload spec's requests and simulate them.")
    p.add_argument("--workload-spec", required=False, default=None, help="workload spec YAML")
    p.add_argument("--num-requests", type=int, default=None, help="override num_requests")
    p.add_argument("--workload-seed", type=int, default=None, help="override the spec's seed")
    add_sim_flags(p)
    add_cluster_flags(p, default_policy="round-robin")
    _output_flags(p)
    p.set_defaults(func=cmd_run)

    p = subparsers.add_parser("replay", help="replay a trace through the simulator",
                              description="Replay a TraceV2 (header + CSV) through the simulator.")
    p.add_argument("--trace-header", default=None, help="TraceV2 header YAML (required)")
    p.add_argument("--trace-data", default=None, help="TraceV2 data CSV (required)")
    p.add_argument("--sequential", action="store_true",
                   help="the trace's client sent one request at a time (observe --max-concurrency 1): "
                        "each request starts when the simulated previous one has finished, or at its "
                        "recorded send if later")
    add_sim_flags(p)
    add_cluster_flags(p, default_policy="recorded")
    _output_flags(p)
    p.set_defaults(func=cmd_replay)

    p = subparsers.add_parser(
        "fit", help="fit the latency model (linear, or two-row roofline-fit) to a trace",
        description="Least-squares fit of the step-time model (--step-shape) and the frontend term to a "
                    "trace's per-request TTFT and ITL; prints the fit's own error.")
    p.add_argument("--trace-header", action="append", default=None,
                   help="TraceV2 header YAML (required; repeat with --trace-data to fit one model "
                        "to several traces)")
    p.add_argument("--trace-data", action="append", default=None,
                   help="TraceV2 data CSV (required; one per --trace-header, in the same order)")
    p.add_argument("--output", default=None, help="write the coefficients here (YAML, or .json)")
    p.add_argument("--validate-header", default=None,
                   help="also report the fitted model's error on this trace (header)")
    p.add_argument("--validate-data", default=None, help="... and its data CSV")
    p.add_argument("--max-iterations", type=int, default=10,
                   help="replay-and-solve iterations (default %(default)s; up to 3x as many while each new "
                        "iterate still improves on every earlier one by 1 %%)")
    p.add_argument("--initial-coefficients", default=None,
                   help="start the fit from these coefficients (default: the bundled ones); "
                        "--latency-coefficients is a start too (both given: two starts)")
    p.add_argument("--no-prior", action="store_true",
                   help="fit without the roofline prior (by default: from --model-config or a "
                        "bundled --model or the header's model, with --hardware)")
    p.add_argument("--prior-strength", type=float, default=0.01,
                   help="weight λ/√rows of the prior rows λ·(w−prior)/prior (default 0.01)")
    p.add_argument("--bootstrap-resamples", type=int, default=100,
                   help="resamples of the requests for the coefficients' intervals (default 100)")
    p.add_argument("--search-evaluations", type=int, default=SEARCH_EVALUATIONS,
                   help="replays the search stage may make after the regression (scipy "
                        "least_squares on the replayed per-request errors; default %(default)s, "
                        "0: none)")
    p.add_argument("--step-shape", choices=("linear", "roofline"), default="linear",
                   help="linear (default): one row; roofline: model roofline-fit, each step "
                        "base + max(compute row, memory row), for servers with a compute/memory knee")
    add_sim_flags(p)
    p.set_defaults(func=cmd_fit)


# --------------------------------------------------------------------------------------------


def require_files(args: argparse.Namespace, *names: str) -> None:
    """A usage error unless each named file flag is given and exists (shared with ``blis sweep``)."""
    for name in names:
        if not getattr(args, name):
            raise UsageError(f"--{name.replace('_', '-')} is required")
    for name in names:
        path = Path(getattr(args, name))
        if not path.exists():
            raise UsageError(f"--{name.replace('_', '-')} file not found: {path}")


def _latency(args: argparse.Namespace) -> tuple[StepModel | None, str]:
    """The latency model the flags give (None: the bundled default, resolved with the rest)."""
    if args.latency_model == "roofline":
        if args.latency_coefficients:
            raise UsageError("--latency-coefficients applies to --latency-model linear only (the "
                             "roofline is derived from --model-config and --hardware): drop one")
        geom = geometry_for(args.model, args.model_config)
        if geom is None:
            raise UsageError("--latency-model roofline needs --model-config config.json (or a "
                             f"known --model; {args.model!r} is not bundled)")
        return roofline(geom, get_hardware(args.hardware or DEFAULT_HARDWARE), args.tp), \
            f"roofline:{args.model_config or args.model}"
    if args.latency_coefficients:
        return load_coefficients(args.latency_coefficients).to_step_model(), \
            str(args.latency_coefficients)
    return None, "default"


def _validate_sim_flags(args: argparse.Namespace) -> None:
    for name in ("total_kv_blocks", "block_size_in_tokens"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be ≥ 1, got {v}")
    if args.total_kv_blocks is not None and args.total_kv_blocks < 2:
        raise UsageError("--total-kv-blocks must be ≥ 2 (vLLM reserves one null block)")
    if args.horizon is not None and not args.horizon > 0:
        raise UsageError(f"--horizon must be > 0, got {args.horizon}")
    if args.tp < 1:
        raise UsageError(f"--tp must be ≥ 1, got {args.tp}")

    for name, maximum in (("total_kv_blocks", limits.MAX_GPU_BLOCKS), ("block_size_in_tokens", limits.MAX_BLOCK_TOKENS),
                          ("max_num_seqs", limits.MAX_NUM_SEQS), ("max_num_batched_tokens", limits.MAX_REQUEST_TOKENS),
                          ("long_prefill_token_threshold", limits.MAX_REQUEST_TOKENS),
                          ("num_requests", limits.MAX_REQUESTS), ("tp", limits.MAX_THREADS)):
        v = getattr(args, name, None)
        if v is not None and v > maximum:
            raise UsageError(f"--{name.replace('_', '-')} {limits.over(v, maximum)}")


def offload_flags(args: argparse.Namespace) -> OffloadFlags:
    """The offload flags, loaded by :func:`resolve_settings` once the block size and KV size are known."""
    return OffloadFlags(config=args.kv_offload_config or None,
                        offloading_size=getattr(args, "kv_offloading_size", None),
                        offloading_backend=getattr(args, "kv_offloading_backend", None),
                        defaults_filepath=args.defaults_filepath,
                        command=getattr(args, "command", None) or "run")


def options_from_args(args: argparse.Namespace, header: TraceHeader | None = None, *,
                      trace_name: str | None = None) -> EngineOptions:
    """The engine's options from the flags and the trace header (:func:`resolve_settings`: flag,
    header, model, default). Replaying (or fitting) an observed trace (``mode: real``) on a KV size
    or batch limit that neither the header nor a flag gave warns on stderr: the real server's limits
    are unknown, and they set its capacity."""
    _validate_sim_flags(args)
    latency, source = _latency(args)
    command = getattr(args, "command", None) or "replay"
    given = EngineOptions(
        model=args.model, model_config=args.model_config, hardware=args.hardware, tp=args.tp,
        num_gpu_blocks=args.total_kv_blocks, block_size=args.block_size_in_tokens,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.long_prefill_token_threshold, seed=args.seed,
        horizon_us=args.horizon, latency=latency, latency_source=source,
        sequential=getattr(args, "sequential", False),
        # the roofline is the model's (its config and the hardware), not a file the user gave
        sources={"latency_model": "model"} if args.latency_model == "roofline" else {})
    try:
        return resolve_settings(given, header, offload_flags=offload_flags(args), trace_name=trace_name,
                                warn=lambda m: print(f"blis {command}: warning: {m}", file=sys.stderr))
    except ConfigError:
        raise
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _write_outputs(args: argparse.Namespace, outcome: SimulatedOutputs,
                   trace: Trace | ColumnarTrace | None = None) -> None:
    """Write the requested files (from the outcome's columns: no object per request)."""
    metrics = outcome.write_outputs(results_path=args.results_path or None,
                                    metrics_path=args.metrics_path or None)
    if trace is not None and getattr(args, "trace_output", None):
        write_trace(trace, f"{args.trace_output}.yaml", f"{args.trace_output}.csv",
                    blis_compatible=args.blis_compatible)
    shown = metrics.model_copy(update={"cache_hit_rate": None, "requests": []})
    sys.stdout.write(metrics_output_text(shown) + "\n")


def cmd_run(args: argparse.Namespace) -> int:

    require_files(args, "workload_spec")
    spec = load_workload_spec(args.workload_spec)
    options = options_from_args(args)
    from blis_sim.routing import RoutingSpec

    routing = RoutingSpec.parse(args.routing_policy, args.routing_scorers)
    n = args.num_instances or 1
    if not 1 <= n <= limits.MAX_INSTANCES:
        raise UsageError(f"--num-instances must be in 1..{limits.MAX_INSTANCES}, got {n}")
    if n > 1:
        from blis_sim.engine.cluster import run_cluster

        out: Any = run_cluster(spec, options, num_instances=n, routing=routing, seed=args.workload_seed,
                               num_requests=args.num_requests)
    else:
        out = run_outcome(spec, options, seed=args.workload_seed, num_requests=args.num_requests)
    trace = out.trace_columns(workload_spec=str(args.workload_spec)) if args.trace_output else None
    _write_outputs(args, out, trace)
    return 0


def _load(args: argparse.Namespace, header_flag: str, data_flag: str) -> ColumnarTrace:
    """The trace, its rows as columns (``.records`` made on first use)."""
    require_files(args, header_flag, data_flag)
    return load_trace_columns(getattr(args, header_flag), getattr(args, data_flag))


def cmd_replay(args: argparse.Namespace) -> int:

    trace = _load(args, "trace_header", "trace_data")
    if not args.model:
        raise UsageError("LLM name not provided (--model). Exiting simulation.")
    name = f"{args.trace_header} / {args.trace_data}"
    options = options_from_args(args, trace.header, trace_name=name)
    n, routing = cluster_of(args, trace)
    try:
        if n > 1:
            from blis_sim.engine.cluster import replay_cluster

            out: Any = replay_cluster(trace, options, num_instances=n, routing=routing)
            if out.agreement is not None:
                print(f"blis replay: routing agreement with the recorded replicas: "
                      f"{out.agreement:.4f} ({routing.policy})", file=sys.stderr)
        else:
            out = replay_outcome(trace, options)
    except InputError as exc:  # what the trace holds (BC-10, no usable row): name the trace
        if exc.location.file is not None:
            raise
        raise type(exc)(exc.reason, file=name, line=exc.location.line, field=exc.location.field) from None
    _write_outputs(args, out, out.trace_columns() if args.trace_output else None)
    return 0


def cluster_of(args: argparse.Namespace, trace: ColumnarTrace) -> tuple[int, RoutingSpec]:
    """(replicas, routing) of a replay: ``--num-instances``, else the header's cluster block, else
    one more than the largest recorded replica, else 1 (a single server: the plain replay)."""
    from blis_sim.routing import RoutingSpec

    routing = RoutingSpec.parse(args.routing_policy, args.routing_scorers)
    n = args.num_instances
    if n is not None and not 1 <= n <= limits.MAX_INSTANCES:
        raise UsageError(f"--num-instances must be in 1..{limits.MAX_INSTANCES}, got {n}")
    ext = trace.header.pytest_blis
    if n is None and ext is not None and ext.cluster is not None:
        n = ext.cluster.num_instances
    if n is None:
        const, value = trace.data.constant("replica") if hasattr(trace, "data") else (True, -1)
        recorded = int(trace.data.array("replica").max()) if not const else int(value)
        n = recorded + 1 if recorded != -1 else 1
    return n, routing


def _fit_traces(args: argparse.Namespace) -> list[tuple[str, ColumnarTrace]]:
    """(data path, trace) of each --trace-header / --trace-data pair, in order."""
    headers, data = args.trace_header or [], args.trace_data or []
    if len(headers) != len(data):
        raise UsageError(f"blis fit: {len(headers)} --trace-header but {len(data)} --trace-data: "
                         "give one of each per trace")
    out = []
    for h, d in zip(headers, data) if headers else [(None, None)]:
        pair = argparse.Namespace(trace_header=h, trace_data=d)
        out.append((str(d), _load(pair, "trace_header", "trace_data")))
    return out


def cmd_fit(args: argparse.Namespace) -> int:

    loaded = _fit_traces(args)
    trace = loaded[0][1]
    if args.latency_model != "linear":
        raise UsageError("blis fit fits a fitted-shape model (--step-shape); drop --latency-model "
                         "roofline")
    if args.bootstrap_resamples < 0 or args.prior_strength < 0:
        raise UsageError("--bootstrap-resamples and --prior-strength must be ≥ 0")
    if args.max_iterations < 1:
        raise UsageError(f"--max-iterations must be ≥ 1, got {args.max_iterations}")
    # every coefficient file the user gives is a start (issue 27): the first through the options,
    # as a replay would load it, the other scored beside it
    files = list(dict.fromkeys(str(f) for f in (args.initial_coefficients,
                                                args.latency_coefficients) if f))
    start_args = argparse.Namespace(**{**vars(args),
                                       "latency_coefficients": files[0] if files else None})
    options = [options_from_args(start_args, t.header) for _, t in loaded]
    start = files[0] if files else "default"
    starts = [(f, load_coefficients(f)) for f in files[1:]]
    print(f"blis fit: starting from {' and '.join(files) or 'default'} coefficients",
          file=sys.stderr)
    prior, label = (None, "none: --no-prior") if args.no_prior else resolve_prior(
        model=args.model, model_config=args.model_config, hardware=args.hardware, tp=args.tp,
        header=trace.header, shape=args.step_shape)
    if args.search_evaluations < 0:
        raise UsageError(f"--search-evaluations must be ≥ 0, got {args.search_evaluations}")
    coeffs = fit([t for _, t in loaded], options, max_iterations=args.max_iterations,
                 name=[n for n, _ in loaded], prior=prior, prior_label=label,
                 prior_strength=args.prior_strength, bootstrap_resamples=args.bootstrap_resamples,
                 seed=args.seed, start=start, shape=args.step_shape,
                 search_evaluations=args.search_evaluations, starts=starts)
    if coeffs.fit is not None:
        sys.stderr.write(coeffs.fit.text() + "\n")
    if args.output:

        dump_coefficients(coeffs, args.output)
    report: dict[str, Any] = {"coefficients": coeffs.model_dump(exclude={"fit"}),
                              "fit": coeffs.fit.model_dump() if coeffs.fit else None}
    if args.validate_header or args.validate_data:
        other = _load(args, "validate_header", "validate_data")

        opts = with_flags(options_from_args(args, other.header), latency=coeffs.to_step_model(),
                       latency_source=str(args.output or "fit"))
        report["validation"] = evaluate(other, opts, name=str(args.validate_data)).model_dump()
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0
