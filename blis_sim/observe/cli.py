"""`blis observe`: flags → :class:`ObserveOptions` + workload, run, write the trace, exit code.

``register(subparsers)`` adds the subcommand with the reference's flags (docs/reference-formats.md §3.1) that
apply, plus ours: ``--settle``, ``--window-phases``, ``--grace``, ``--no-tokenize``,
``--blis-compatible``, ``--progress/--no-progress``. Exit codes: 0 written; 2 bad flags or spec;
3 no request succeeded (the trace is still written); 130 interrupted (what was collected is written,
marked partial).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from typing import TYPE_CHECKING, Any

from blis_sim.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_SERVER_ERROR, UsageError, one_line

if TYPE_CHECKING:
    from blis_sim.cli import Subparsers
    from blis_sim.formats.workload import WorkloadSpec
    from blis_sim.observe.run import ObserveOptions
    from blis_sim.routing import RoutingSpec

# What a command runs is imported inside its function: `blis --help` imports every subcommand's
# module (blis_sim/cli.py), and a command needs only its own dependencies.

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds from a Go duration (``60s``, ``1m30s``, ``500ms``) or a plain number of seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise UsageError(f"invalid duration {text!r} (use e.g. 60s, 1m30s, 500ms or seconds)")
    return total


TARGET_FLAGS = ("server_url", "model", "trace_header", "trace_data")


def add_target_flags(p: argparse.ArgumentParser, *, cluster: bool = False) -> None:
    """The four required flags `blis observe` and `blis probe` share: where to send, what to write
    (``cluster``: ``--server-url`` may be given once per replica)."""
    if cluster:
        p.add_argument("--server-url", action="append", default=[],
                       help="server base URL, e.g. http://127.0.0.1:8000 (required); once per replica for a "
                            "cluster, routed by --routing-policy (docs/cluster.md)")
    else:
        p.add_argument("--server-url", default="", help="server base URL, e.g. http://127.0.0.1:8000 (required)")
    p.add_argument("--model", default="", help="model name sent in every request (required)")
    p.add_argument("--trace-header", default="", help="where to write the TraceV2 header YAML (required)")
    p.add_argument("--trace-data", default="", help="where to write the TraceV2 data CSV (required)")


def require(args: argparse.Namespace, names: tuple[str, ...] = TARGET_FLAGS) -> None:
    for name in names:
        if not getattr(args, name):
            raise UsageError(f"--{name.replace('_', '-')} is required")


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "observe", help="dispatch a workload to a vLLM server and record a TraceV2 (+ KV counter window)",
        description="Send a workload to an OpenAI-compatible vLLM server, record every request's timings in a "
                    "TraceV2 (header YAML + data CSV) and, with --scrape-kv-metrics, the server's KV hit-rates "
                    "over the measured window. Exit 0 written, 2 bad input, 3 no request succeeded, 130 "
                    "interrupted (partial trace written).")
    add_target_flags(p, cluster=True)
    a = p.add_argument
    a("--routing-policy", default="round-robin",
      help="several --server-url: round-robin (default), least-loaded, always-busiest, prefix-affinity, weighted")
    a("--router-url", default="",
      help="send every request to this router instead; --server-url then lists the replicas (scraped, in "
           "order) and --replica-header names the response header that says which one served")
    a("--replica-header", default="", help="with --router-url: the response header naming the replica (its URL, "
                                           "host:port or index)")
    a("--routing-scorers", default=None,
      help="weighted: name:weight,... over prefix-affinity and queue-depth (e.g. prefix-affinity:3,queue-depth:2)")
    a("--workload-spec", default="", help="workload spec YAML (reference v2, plus our phases)")
    a("--workload", default="", help="a reference preset name (not supported: use --workload-spec)")
    a("--rate", type=float, default=0.0,
      help="synthesise one client at this rate, req/s (docs/reference-formats.md §2.3)")
    a("--concurrency", type=int, default=0, help="synthesise N closed-loop users")
    a("--think-time-ms", type=float, default=0.0, help="closed-loop think time with --concurrency, ms")
    for name, default in (("prompt-tokens", 512), ("output-tokens", 512)):
        a(f"--{name}", type=int, default=default, help=f"synthesis: mean {name.replace('-', ' ')}")
        a(f"--{name}-stdev", type=int, default=256, help="synthesis: standard deviation")
        a(f"--{name}-min", type=int, default=2, help="synthesis: minimum")
        a(f"--{name}-max", type=int, default=7000, help="synthesis: maximum")
    a("--prefix-tokens", type=int, default=0, help="synthesis: shared prefix of N tokens (group 'shared')")
    a("--api-key", default="", help="sent as 'Authorization: Bearer' to inference, /tokenize and /metrics")
    a("--server-type", default="vllm", help="header server.type (default vllm)")
    a("--api-format", default="completions", help="completions (default) or chat")
    a("--no-streaming", action="store_true", help="send every request non-streaming")
    a("--http-client", default="lean", choices=("lean", "aiohttp"),
      help="generation requests to http:// servers: our lean keep-alive HTTP/1.1 client (default, "
           "~0.3 ms of CPU per request) or aiohttp (~0.7 ms); https:// always uses aiohttp")
    a("--max-concurrency", type=int, default=None, help="in-flight cap (default 256; N with --concurrency N)")
    a("--warmup-requests", type=int, default=0, help="mark the first N dispatched requests as warm-up (kept)")
    a("--prewarm-duration", default="0", help="prewarm before the window, a Go duration (e.g. 30s)")
    a("--timeout", type=float, default=300.0, help="per-request and per-scrape timeout, seconds (1..86400)")
    a("--seed", type=int, default=None, help="override the spec's seed")
    a("--num-requests", type=int, default=0, help="override num_requests (> 0)")
    a("--horizon", type=int, default=0, help="override the horizon, µs (> 0)")
    a("--scrape-kv-metrics", action="store_true", help="scrape /metrics around the measured window")
    a("--kv-metrics-url", default="", help="metrics URL (default <server-url>/metrics)")
    a("--vllm-commit", default="", help="recorded verbatim in observed_kv_metrics.vllm_commit")
    a("--rtt-ms", type=float, default=0.0, help="measured network RTT, ms (header network.measured_rtt_ms)")
    a("--record-itl", action="store_true", help="record every SSE chunk time (forces streaming)")
    a("--itl-output", default="", help="ITL CSV path (default <trace-data minus .csv>.itl.csv)")
    a("--settle", type=float, default=1.0, help="wait before each scrape for vLLM's stats interval, s (default 1)")
    a("--window-phases", default="", help="comma-separated phases inside the counter window (default all)")
    a("--grace", type=float, default=5.0, help="after Ctrl-C/SIGTERM, seconds in-flight requests get (default 5)")
    a("--no-tokenize", action="store_true", help="do not use /tokenize; calibrate tokens per word instead")
    a("--tokenizer", default="", metavar="PATH",
      help="the served model's Hugging Face tokenizer (its folder or tokenizer.json, local files only): prompts of "
           "exact lengths counted offline, for servers without /tokenize")
    a("--blis-compatible", action="store_true", help="leave our pytest_blis header block out (BLIS can read it)")
    a("--progress", dest="progress", action="store_true", default=None, help="force the progress bar")
    a("--no-progress", dest="progress", action="store_false", help="never show the progress bar")
    p.set_defaults(func=run)


def _check_required(args: argparse.Namespace) -> None:
    require(args)
    if args.workload:
        if args.workload_spec:
            raise UsageError("--workload and --workload-spec are mutually exclusive")
        raise UsageError(f"--workload {args.workload!r}: presets are not supported; write a --workload-spec")
    if args.concurrency and args.rate:
        raise UsageError("--concurrency and --rate are mutually exclusive; use one or the other")
    if args.workload_spec and args.concurrency:
        raise UsageError("--concurrency cannot be used with --workload-spec; define concurrency in the spec file "
                         "using clients[].concurrency instead")
    if not (args.workload_spec or args.rate or args.concurrency):
        raise UsageError("Either --workload-spec, --rate, or --concurrency is required")
    if args.rate < 0 or not math.isfinite(args.rate) or args.concurrency < 0:
        raise UsageError("--rate and --concurrency must be >= 0")


def synthesized_spec(args: argparse.Namespace) -> WorkloadSpec:
    """The reference's distribution synthesis (docs/reference-formats.md §2.3): one client, constant arrivals,
    gaussian lengths."""
    from blis_sim.formats.workload import WorkloadSpec

    def gaussian(prefix: str) -> dict[str, Any]:
        mean, std, lo, hi = (getattr(args, prefix + k) for k in ("", "_stdev", "_min", "_max"))
        return {"type": "gaussian", "params": {"mean": mean, "std_dev": std, "min": lo, "max": hi}}

    client: dict[str, Any] = {"id": "distribution", "streaming": True,
                              "input_distribution": gaussian("prompt_tokens"),
                              "output_distribution": gaussian("output_tokens")}
    spec: dict[str, Any] = {"version": "2", "seed": 42 if args.seed is None else args.seed,
                            "num_requests": args.num_requests, "horizon": args.horizon}
    if args.concurrency:
        client.update(concurrency=args.concurrency, think_time_us=int(args.think_time_ms * 1000))
    else:
        client.update(rate_fraction=1.0, arrival={"process": "constant"})
        spec["aggregate_rate"] = args.rate
    if args.prefix_tokens > 0:
        client.update(prefix_group="shared", prefix_length=args.prefix_tokens)
    spec["clients"] = [client]
    return WorkloadSpec.model_validate(spec)


def options_from_args(args: argparse.Namespace) -> ObserveOptions:
    from blis_sim.observe.run import ObserveOptions

    max_conc = args.max_concurrency if args.max_concurrency is not None else (args.concurrency or 256)
    windows = tuple(s.strip() for s in args.window_phases.split(",") if s.strip()) or None
    label = args.workload_spec or ""
    opts = ObserveOptions(
        model=args.model, api_format=args.api_format, api_key=args.api_key, no_streaming=args.no_streaming,
        max_concurrency=max_conc, warmup_requests=args.warmup_requests,
        prewarm_duration_s=parse_duration(args.prewarm_duration), timeout_s=args.timeout, seed=args.seed,
        num_requests=args.num_requests or None, horizon_us=args.horizon or None,
        scrape_kv_metrics=args.scrape_kv_metrics, kv_metrics_url=args.kv_metrics_url,
        vllm_commit=args.vllm_commit, settle_s=args.settle, window_phases=windows, rtt_ms=args.rtt_ms,
        record_itl=args.record_itl, server_type=args.server_type, workload_label=label, grace_s=args.grace,
        use_tokenize=not args.no_tokenize, tokenizer=args.tokenizer, progress=args.progress, handle_signals=True,
        http_client=args.http_client)
    opts.validate()
    return opts


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time, so a handler left behind by an in-process
    run (pytester, an embedding application) never writes to a stream that has since been closed."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def _setup_logging(prog: str = "blis observe") -> None:
    logger = logging.getLogger("blis_sim")
    if not logger.handlers:
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter(prog + ": %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def run(args: argparse.Namespace) -> int:
    from blis_sim.formats.trace import default_itl_path
    from blis_sim.formats.workload import load_workload_spec
    from blis_sim.observe.run import observe, write_result

    _check_required(args)
    options = options_from_args(args)
    if args.workload_spec:
        spec = load_workload_spec(args.workload_spec)
        if args.num_requests <= 0 and args.horizon <= 0 and not _bounded(spec):
            raise UsageError("Workload requires either num_requests, --num-requests, or --horizon to bound "
                             "generation")
    else:
        if args.num_requests <= 0 and args.horizon <= 0:
            raise UsageError("Workload requires either num_requests, --num-requests, or --horizon to bound "
                             "generation")
        spec = synthesized_spec(args)
    _setup_logging()
    urls = list(args.server_url)
    routing = _routing(args, len(urls))
    if len(urls) > 1 or args.router_url:
        from blis_sim.observe.cluster import observe_cluster

        result = observe_cluster(urls, spec, options, routing=routing, router_url=args.router_url,
                                 replica_header=args.replica_header)
    else:
        result = observe(urls[0], spec, options)
    args.server_url = ", ".join(urls)
    itl_path = (args.itl_output or default_itl_path(args.trace_data)) if args.record_itl else None
    write_result(result, args.trace_header, args.trace_data, blis_compatible=args.blis_compatible,
                 itl_path=itl_path)
    print("=== Simulation Metrics ===")
    print(json.dumps(result.summary(), indent=2))
    log = logging.getLogger("blis_sim.observe")
    log.info("trace exported: %d records to %s / %s (prompts: %s)", len(result.trace.records),
             args.trace_header, args.trace_data, result.prompt_mode)
    if result.interrupted:
        log.warning("interrupted: the trace holds what was collected and is marked partial")
        return EXIT_INTERRUPTED
    if result.trace.records and result.ok_requests == 0:
        first = next((r.error_message for r in result.trace.records if r.error_message), "")
        print(one_line(f"blis observe: error: {args.server_url}: no request succeeded ({first}); trace written"),
              file=sys.stderr)
        return EXIT_SERVER_ERROR
    return EXIT_OK


def _routing(args: argparse.Namespace, replicas: int) -> RoutingSpec:
    """The client-side routing of several ``--server-url`` (checked before anything is sent)."""
    from blis_sim.routing import RoutingSpec

    routing = RoutingSpec.parse(args.routing_policy, args.routing_scorers)
    if args.router_url and (args.routing_policy != "round-robin" or args.routing_scorers):
        raise UsageError("--router-url: the router routes; --routing-policy and --routing-scorers route on the client")
    if args.replica_header and not args.router_url:
        raise UsageError("--replica-header names the header of a --router-url's responses; no --router-url was given")
    if replicas == 1 and not args.router_url and (args.routing_policy != "round-robin" or args.routing_scorers):
        raise UsageError("--routing-policy and --routing-scorers route over several --server-url; one was given")
    return routing


def _bounded(spec: WorkloadSpec) -> bool:
    return any(p.num_requests > 0 or p.horizon > 0 for p in spec.resolved_phases())
