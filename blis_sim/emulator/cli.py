"""`blis emulate`: serve the vLLM emulator until interrupted.

``register(subparsers)`` adds the subcommand; ``config_from_args`` / ``config_to_argv`` convert
between flags and :class:`EmulatorConfig` (the subprocess launcher uses the latter). Once bound,
the command prints ``blis emulate: serving <url>`` on stdout (one line, flushed).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from blis_sim.emulator import loop as event_loop
from blis_sim.emulator.config import METRICS_FAULTS, METRICS_PROFILES, EmulatorConfig, FaultConfig
from blis_sim.emulator.profiles import PROFILES
from blis_sim.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from blis_sim.cli import Subparsers

# What a command runs is imported inside its function: `blis --help` imports every subcommand's
# module (blis_sim/cli.py), and a command needs only its own dependencies.

# (flag, EmulatorConfig field, type) for the plain value flags.
_VALUE_FLAGS: tuple[tuple[str, str, Any], ...] = (
    ("--host", "host", str),
    ("--port", "port", int),
    ("--served-model-name", "model", str),
    ("--profile", "profile", str),
    ("--block-size", "block_size", int),
    ("--num-gpu-blocks", "num_gpu_blocks", int),
    ("--kv-bytes-per-token", "kv_bytes_per_token", int),
    ("--max-model-len", "max_model_len", int),
    ("--max-num-seqs", "max_num_seqs", int),
    ("--max-num-batched-tokens", "max_num_batched_tokens", int),
    ("--kv-offload-config", "kv_offload_config", str),
    ("--tokenizer", "tokenizer", str),
    ("--metrics-profile", "metrics_profile", str),
    ("--stats-interval", "stats_interval_s", float),
    ("--eos-probability", "eos_probability", float),
    ("--step-noise", "step_noise", float),
    ("--seed", "seed", int),
    ("--served-version", "served_version", str),
    ("--nice", "nice", int),
)
# (flag, EmulatorConfig field, value when the flag is given)
_BOOL_FLAGS: tuple[tuple[str, str, bool], ...] = (
    ("--no-enable-prefix-caching", "enable_prefix_caching", False),
    ("--no-enable-chunked-prefill", "enable_chunked_prefill", False),
    ("--enable-prompt-tokens-details", "enable_prompt_tokens_details", True),
    ("--enable-per-request-metrics", "enable_per_request_metrics", True),
    ("--no-created-series", "created_series", False),
    ("--add-bos", "add_bos", True),
)
_FAULT_FLAGS: tuple[tuple[str, str, Any], ...] = (
    ("--fault-metrics", "metrics", str),
    ("--fault-error-rate", "error_rate", float),
    ("--fault-error-status", "error_status", int),
    ("--fault-stream-cut-rate", "stream_cut_rate", float),
    ("--fault-stream-cut-after", "stream_cut_after_tokens", int),
    ("--fault-first-token-delay", "first_token_delay_s", float),
    ("--fault-first-token-delay-rate", "first_token_delay_rate", float),
    ("--fault-stall-rate", "stall_rate", float),
    ("--fault-reset-counters-after", "reset_counters_after", int),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = EmulatorConfig()
    g = p.add_argument_group("server")
    g.add_argument("--host", default=d.host, help="bind address (default %(default)s)")
    g.add_argument("--port", type=int, default=8000, help="port, 0 = a free one (default %(default)s)")
    g.add_argument("--replicas", type=int, default=1,
                   help="serve this many independent replicas (a cluster, docs/cluster.md §6), each with its own "
                        "engine and caches, on --port, --port+1, ... (0: free ports); one ready line each")
    g.add_argument("--served-model-name", "--model", dest="model", default=d.model,
                   help="model name served and labelled in /metrics (default %(default)s)")
    g.add_argument("--served-version", default=None, help="what /version reports")
    g.add_argument("--nice", type=int, default=d.nice,
                   help="scheduling niceness of this process, -20..19 (default %(default)s). A negative value "
                        "keeps the emulator's step timing from waiting behind other jobs on a shared machine; "
                        "it needs root or CAP_SYS_NICE, and without them the emulator says so and runs as is")
    g = p.add_argument_group("engine")
    g.add_argument("--profile", default=d.profile, choices=sorted(PROFILES),
                   help="step-time profile (default %(default)s)")
    g.add_argument("--block-size", type=int, help="tokens per KV block (profile default)")
    g.add_argument("--num-gpu-blocks", "--num-gpu-blocks-override", dest="num_gpu_blocks", type=int,
                   help="GPU KV blocks, including vLLM's null block (profile default)")
    g.add_argument("--kv-bytes-per-token", type=int, help="KV bytes per token (sizes offload chunks)")
    g.add_argument("--max-model-len", type=int)
    g.add_argument("--max-num-seqs", type=int)
    g.add_argument("--max-num-batched-tokens", type=int)
    g.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    g.add_argument("--no-enable-chunked-prefill", dest="enable_chunked_prefill", action="store_false")
    g.add_argument("--kv-offload-config",
                   help="offload config: the simulator's YAML, or vllm serve's --kv-transfer-config "
                        "(a JSON or YAML file, or the JSON): CPU + fs tiers")
    g.add_argument("--eos-probability", type=float, default=d.eos_probability,
                   help="chance per token of EOS (finish_reason stop), default %(default)s")
    g.add_argument("--step-noise", type=float, help="relative step-time noise (profile default)")
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--add-bos", action="store_true", help="prepend <s> to text prompts (built-in tokenizer)")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="the served model's Hugging Face tokenizer: its folder or tokenizer.json (local files "
                        "only). Token counts, /tokenize and the chat template are then that model's, as vLLM's "
                        "(default: the emulator's built-in tokenizer, whose counts are not any model's)")
    g = p.add_argument_group("metrics")
    g.add_argument("--metrics-profile", default=d.metrics_profile, choices=METRICS_PROFILES)
    g.add_argument("--stats-interval", dest="stats_interval_s", type=float, default=d.stats_interval_s,
                   help="seconds between counter publications, 0 = every step (default %(default)s)")
    g.add_argument("--no-created-series", dest="created_series", action="store_false",
                   help="omit *_created samples (vLLM multiprocess mode)")
    g.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="usage.prompt_tokens_details.cached_tokens per request")
    g.add_argument("--enable-per-request-metrics", action="store_true",
                   help="server-side timings (usage.metrics) in each request's final usage object")
    g = p.add_argument_group("fault injection")
    g.add_argument("--fault-metrics", choices=METRICS_FAULTS, default="ok",
                   help="/metrics answers: ok, http500, drop (connection closed), hang")
    g.add_argument("--fault-error-rate", type=float, default=0.0)
    g.add_argument("--fault-error-status", type=int, default=500, help="500, 429 or 503")
    g.add_argument("--fault-stream-cut-rate", type=float, default=0.0)
    g.add_argument("--fault-stream-cut-after", type=int, default=1, help="tokens sent before a cut")
    g.add_argument("--fault-first-token-delay", type=float, default=0.0, help="seconds")
    g.add_argument("--fault-first-token-delay-rate", type=float, default=1.0)
    g.add_argument("--fault-stall-rate", type=float, default=0.0)
    g.add_argument("--fault-reset-counters-after", type=int, default=None,
                   help="restart counters and caches after N finished requests")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="stop when the parent process goes away (spawn_emulator sets it, so a crashed "
                        "test run leaves no orphan servers)")


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    faults = FaultConfig(**{field: getattr(args, _dest(flag)) for flag, field, _ in _FAULT_FLAGS})
    values = {field: getattr(args, field) for _, field, _ in _VALUE_FLAGS if field != "model"}
    values["model"] = args.model
    for _, field, _ in _BOOL_FLAGS:
        values[field] = getattr(args, field)
    return EmulatorConfig(**values, faults=faults)


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def config_to_argv(config: EmulatorConfig) -> list[str]:
    """Flags that rebuild ``config`` in a subprocess (an in-memory ``offload`` spec cannot travel)."""
    if config.offload is not None:
        raise UsageError("an EmulatorConfig with an in-memory offload spec cannot be spawned; "
                         "give kv_offload_config (a file) instead", field="offload")
    argv: list[str] = []
    for flag, field, _ in _VALUE_FLAGS:
        value = getattr(config, field)
        if value is not None:
            argv += [flag, str(value)]
    for flag, field, when_given in _BOOL_FLAGS:
        if getattr(config, field) == when_given:
            argv.append(flag)
    default_faults = FaultConfig()
    for flag, field, _ in _FAULT_FLAGS:
        value = getattr(config.faults, field)
        if value != getattr(default_faults, field):
            argv += [flag, str(value)]
    return argv


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    from blis_sim.emulator.runner import READY_PREFIX, serve

    refused = set_niceness(config.nice)
    if refused:
        print(f"blis emulate: {refused}", file=sys.stderr, flush=True)

    replicas = getattr(args, "replicas", 1)
    if not 1 <= replicas <= 64:
        raise UsageError(f"--replicas must be in 1..64, got {replicas}")
    spec = config.offload_spec() if replicas > 1 else None
    if spec is not None and spec.secondary_tiers:
        raise UsageError("--replicas: an offload config with fs tiers would have every replica share one "
                         "root_dir; give each replica its own emulator")

    async def main() -> None:
        served = [await serve(config if k == 0 else config.replace(port=config.port + k if config.port else 0))
                  for k in range(replicas)]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watcher = None  # held: the loop keeps only a weak reference to a task
        if getattr(args, "exit_with_parent", False):
            watcher = loop.create_task(_watch_parent(os.getppid(), stop))
        # What start-up made (modules, the block pool, the engine) lives as long as the server: keep it
        # out of the cycle collector's scans, as vLLM freezes its heap after start-up, so that full
        # collections stay short while requests are served.
        gc.freeze()
        print(f"blis emulate: tokenizer: {served[0][0].engine.tokenizer.describe()}", file=sys.stderr, flush=True)
        for _, _, url in served:
            print(f"{READY_PREFIX}{url}", flush=True)
        try:
            await stop.wait()
        finally:
            if watcher is not None:
                watcher.cancel()
            for runner, _, _ in served:
                await runner.cleanup()

    event_loop.run(main())
    return EXIT_OK


def set_niceness(nice: int) -> str | None:
    """Give this process scheduling niceness ``nice``; why not, when the OS refuses (else None)."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice == current:
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        return (f"niceness {nice} refused (raising priority needs root or CAP_SYS_NICE); running at "
                f"{current}, so other jobs on this machine can delay the emulator's steps")
    return None


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent:  # re-parented (to init or a subreaper) once the parent exits
        await asyncio.sleep(0.5)
    stop.set()


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "emulate", help="serve a vLLM-compatible emulator (scheduler, prefix cache, offload, /metrics)",
        description="A vLLM-compatible server with vLLM's scheduler, prefix cache, tiered offload "
                    "and /metrics, in real time. See docs/emulator.md.")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m blis_sim.emulator``: the same command without the other subcommands' imports."""
    from blis_sim.errors import BlisError, error_line

    parser = argparse.ArgumentParser(prog="blis emulate")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except BlisError as exc:
        print(error_line("emulate", exc), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
