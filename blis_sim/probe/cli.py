"""`blis probe`: read the server's limits, run the probe within a time budget, write its TraceV2.

Exit codes as `blis observe`: 0 written; 2 bad flags or limits; 3 server unreachable or no request
succeeded (the trace is still written); 130 interrupted (what was collected is written, marked partial).
The next step is ``blis fit --trace-header <probe.yaml> --trace-data <probe.csv> --output latency.yaml``.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from blis_sim.defaults import DEFAULT_MAX_NUM_BATCHED_TOKENS
from blis_sim.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_SERVER_ERROR, UsageError
from blis_sim.observe.cli import add_target_flags, require

if TYPE_CHECKING:
    from blis_sim.cli import Subparsers

# What a command runs is imported inside its function: `blis --help` imports every subcommand's
# module (blis_sim/cli.py), and a command needs only its own dependencies.


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "probe", help="run a designed workload that identifies the latency model's coefficients (for blis fit)",
        description="Read the server's limits (/v1/models max_model_len; block size and GPU blocks from "
                    "vllm:cache_config_info on /metrics), then send a designed probe: single requests across "
                    "prompt lengths, closed-loop decode batches up to max-num-seqs, mixed prefill+decode steps "
                    "and a ramp to saturation (maximum req/s and output tok/s). Writes a TraceV2 for "
                    "`blis fit`. Exit 0 written, 2 bad input, 3 server error, 130 interrupted.")
    add_target_flags(p)
    a = p.add_argument
    a("--time-budget", default="300s", help="stop starting phases after this long, a Go duration (default 300s)")
    a("--max-num-seqs", type=int, default=256, help="the server's --max-num-seqs (vLLM does not publish it; "
                                                    "default 256, vLLM's)")
    a("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
      help=f"the server's --max-num-batched-tokens (default {DEFAULT_MAX_NUM_BATCHED_TOKENS}, vLLM's)")
    for name in ("max-model-len", "block-size", "num-gpu-blocks"):
        a(f"--{name}", type=int, default=0, help=f"override what the server says about its {name.replace('-', ' ')}")
    a("--max-prompt", type=int, default=0, help="cap the longest probe prompt, tokens (default: the server's "
                                                "limit, at most a quarter of the GPU cache)")
    a("--decode-max", type=int, default=0, help="largest decode batch (default --max-num-seqs)")
    a("--ramp-max", type=int, default=0,
      help="largest ramp level (default 2 x --max-num-seqs, at most 256; never above 2 x --max-num-seqs)")
    a("--seed", type=int, default=7, help="prompt content seed (default 7)")
    a("--api-key", default="", help="sent as 'Authorization: Bearer' to every route")
    a("--timeout", type=float, default=300.0, help="per-request timeout, seconds")
    a("--http-client", default="lean", choices=("lean", "aiohttp"), help="as blis observe")
    a("--quiet", action="store_true", help="no phase-by-phase progress on stderr")
    a("--tokenizer", default="", metavar="PATH", help="as blis observe: the served model's tokenizer, prompts of "
                                                      "exact lengths counted offline")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    require(args)
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("max_model_len", "block_size", "num_gpu_blocks", "max_prompt", "decode_max", "ramp_max"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")


def run(args: argparse.Namespace) -> int:
    from blis_sim.observe.cli import _setup_logging, parse_duration
    from blis_sim.observe.run import write_result
    from blis_sim.probe import ProbeConfig, ProbeOptions, read_limits, run_probe

    _check(args)
    budget = parse_duration(args.time_budget)
    _setup_logging("blis probe")
    log = logging.getLogger("blis_sim.observe")
    limits = read_limits(args.server_url, model=args.model, api_key=args.api_key, timeout_s=min(args.timeout, 60),
                         max_model_len=args.max_model_len, block_size=args.block_size,
                         num_gpu_blocks=args.num_gpu_blocks, max_num_seqs=args.max_num_seqs,
                         max_num_batched_tokens=args.max_num_batched_tokens)
    log.info("probe: server limits: max_model_len %d, block size %d, %d GPU blocks, max_num_seqs %d, "
             "max_num_batched_tokens %d; time budget %g s", limits.max_model_len, limits.block_size,
             limits.num_gpu_blocks, limits.max_num_seqs, limits.max_num_batched_tokens, budget)
    config = ProbeConfig(seed=args.seed, max_prompt=args.max_prompt, decode_max=args.decode_max,
                         ramp_max=args.ramp_max)
    options = ProbeOptions(model=args.model, time_budget_s=budget, api_key=args.api_key, timeout_s=args.timeout,
                           http_client=args.http_client, progress=not args.quiet,
                           tokenizer=args.tokenizer)
    result = run_probe(args.server_url, limits, config, options)
    observed = result.observed
    write_result(observed, args.trace_header, args.trace_data)
    for level in result.ramp:
        log.info("probe: ramp %4d: %7.2f req/s %9.1f output tok/s (%d requests in %.2f s)", level.level,
                 level.rps, level.output_tps, level.requests, level.seconds)
    if result.ramp:
        log.info("probe: maximum throughput %.2f req/s, %.1f output tok/s", result.max_rps, result.max_output_tps)
    log.info("probe: %d requests written to %s / %s; next: blis fit --trace-header %s --trace-data %s "
             "--output latency.yaml", len(observed.trace.records), args.trace_header, args.trace_data,
             args.trace_header, args.trace_data)
    if observed.interrupted:
        log.warning("interrupted: the trace holds what was collected and is marked partial")
        return EXIT_INTERRUPTED
    if observed.ok_requests == 0:
        print(f"blis probe: error: {args.server_url}: no request succeeded; trace written", file=sys.stderr)
        return EXIT_SERVER_ERROR
    return EXIT_OK
