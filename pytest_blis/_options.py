"""Command-line options and ini keys, resolved once into a frozen :class:`BlisOptions`.

Resolution order: command line, then ini, then environment (``BLIS_SERVER_URL`` may hold several
URLs separated by commas or whitespace).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

DEFAULT_TOLERANCE_PP = 5.0
DEFAULT_TTFT_MAPE = 0.15
# Embedded emulators stand in for a server with a machine of its own, so they ask for a higher
# scheduling priority than the other jobs on a shared CI host (granted to root or CAP_SYS_NICE).
DEFAULT_EMULATOR_NICE = -10


@dataclass(frozen=True)
class BlisOptions:
    server_urls: tuple[str, ...]
    model: str | None
    kv_offload_config: Path | str | None  # a file, or vllm serve's --kv-transfer-config JSON itself
    vllm_commit: str | None
    hit_rate_tolerance_pp: float
    ttft_mape_threshold: float
    artifacts_dir: Path
    kv_bytes_per_token: int
    emulator_profile: str | None
    emulator_seed: int
    sim_total_kv_blocks: int | None
    full_trace: bool
    parallel_observe: bool = False
    timing_report_only: bool = False  # TTFT/E2E MAPE and throughput reported, not judged (hit-rates still are)
    emulator_nice: int = DEFAULT_EMULATOR_NICE
    kv_offloading_size: float | None = None  # vllm serve's --kv-offloading-size, GiB
    tokenizer: str = ""  # the served model's tokenizer (folder or tokenizer.json); "" none

    @property
    def embedded(self) -> bool:
        """True when no server URL was given: the suite runs against the embedded emulator."""
        return not self.server_urls


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("blis", "calibration scenarios (pytest-blis)")
    group.addoption("--blis-server-url", action="append", default=[], metavar="URL",
                    help="vLLM server to calibrate against (repeatable: servers are shared out among "
                         "xdist workers). Default: an embedded emulator per worker.")
    group.addoption("--blis-model", metavar="NAME",
                    help="model name sent to the server (default: the first of /v1/models)")
    group.addoption("--blis-kv-offload-config", metavar="PATH|JSON",
                    help="the deployment's offload config, used to replay a real server's traces: our kv_offload: "
                         "YAML, or what vllm serve takes as --kv-transfer-config (a JSON or YAML file, or the JSON)")
    group.addoption("--blis-kv-offloading-size", type=float, metavar="GIB",
                    help="the deployment's vllm serve --kv-offloading-size (a CPU tier of GIB, total over TP ranks)")
    group.addoption("--blis-tokenizer", metavar="PATH",
                    help="the served model's Hugging Face tokenizer (its folder or tokenizer.json, local files only): "
                         "embedded emulators count and template as that model (over the scenario's server.tokenizer), "
                         "and prompts are built with it, exact without /tokenize")
    group.addoption("--blis-vllm-commit", metavar="SHA", help="recorded verbatim in every trace header")
    group.addoption("--blis-hit-rate-tolerance-pp", type=float, metavar="PP",
                    help=f"hit-rate tolerance in percentage points (default {DEFAULT_TOLERANCE_PP:g})")
    group.addoption("--blis-timing-report-only", action="store_true", default=False,
                    help="report every cell's TTFT/E2E MAPE and throughput without judging them (hit-rates and "
                         "the cache path still are): for a shared machine whose load would decide the timing")
    group.addoption("--blis-ttft-mape-threshold", type=float, metavar="FRACTION",
                    help=f"TTFT MAPE threshold as a fraction (default {DEFAULT_TTFT_MAPE:g})")
    group.addoption("--blis-artifacts-dir", metavar="DIR",
                    help="where traces, sim results and reports go (default: blis-artifacts)")
    group.addoption("--blis-kv-bytes-per-token", type=int, default=None, metavar="BYTES",
                    help="KV bytes per token per TP rank of the real server's model (sizes the offload "
                         "config's CPU chunks; default 4096)")
    group.addoption("--blis-emulator-profile", metavar="NAME",
                    help="step-time profile of the embedded emulator (default: the scenario's)")
    group.addoption("--blis-emulator-seed", type=int, metavar="N", help="seed of the embedded emulator's noise")
    group.addoption("--blis-emulator-nice", type=int, metavar="N",
                    help=f"scheduling niceness of the embedded emulators, -20..19 (default {DEFAULT_EMULATOR_NICE}: "
                         "their steps do not wait behind other jobs on a shared machine; needs root or "
                         "CAP_SYS_NICE, else a warning and the default priority)")
    group.addoption("--blis-sim-total-kv-blocks", type=int, metavar="N",
                    help="override the simulator's GPU blocks (a deliberately wrong setting shows the gate works)")
    group.addoption("--blis-parallel-observe", action="store_true", default=False,
                    help="let xdist workers observe their embedded emulators at the same time (faster; "
                         "TTFT then includes the other workers' CPU load)")
    group.addoption("--blis-full-trace", action="store_true", default=False,
                    help="show Python tracebacks instead of the compact calibration table")
    parser.addini("blis_server_url", "vLLM server URL(s) to calibrate against", type="linelist")
    parser.addini("blis_model", "model name sent to the server", default="")
    parser.addini("blis_kv_offload_config", "offload config for replaying a real server's traces", default="")
    parser.addini("blis_hit_rate_tolerance_pp", "hit-rate tolerance in percentage points",
                  default=str(DEFAULT_TOLERANCE_PP))
    parser.addini("blis_ttft_mape_threshold", "TTFT MAPE threshold (fraction)", default=str(DEFAULT_TTFT_MAPE))
    parser.addini("blis_artifacts_dir", "where artifacts go", default="blis-artifacts")


def _ini_float(config: pytest.Config, name: str) -> float:
    raw = config.getini(name)
    try:
        return float(raw)
    except ValueError:
        raise pytest.UsageError(f"ini option {name} must be a number, got {raw!r}") from None


def resolve(config: pytest.Config) -> BlisOptions:
    urls = list(config.getoption("blis_server_url") or []) or list(config.getini("blis_server_url"))
    if not urls and os.environ.get("BLIS_SERVER_URL"):
        urls = os.environ["BLIS_SERVER_URL"].replace(",", " ").split()
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise pytest.UsageError(f"--blis-server-url {url!r}: expected http://host:port")
    tol = config.getoption("blis_hit_rate_tolerance_pp")
    tol = _ini_float(config, "blis_hit_rate_tolerance_pp") if tol is None else tol
    mape = config.getoption("blis_ttft_mape_threshold")
    mape = _ini_float(config, "blis_ttft_mape_threshold") if mape is None else mape
    if not (tol >= 0 and mape >= 0):
        raise pytest.UsageError("--blis-hit-rate-tolerance-pp and --blis-ttft-mape-threshold must be >= 0")
    offload = config.getoption("blis_kv_offload_config") or config.getini("blis_kv_offload_config") or None
    artifacts = config.getoption("blis_artifacts_dir") or config.getini("blis_artifacts_dir")
    blocks = config.getoption("blis_sim_total_kv_blocks")
    if blocks is not None and blocks < 1:
        raise pytest.UsageError("--blis-sim-total-kv-blocks must be >= 1")
    nice = config.getoption("blis_emulator_nice")
    nice = DEFAULT_EMULATOR_NICE if nice is None else nice
    if not -20 <= nice <= 19:
        raise pytest.UsageError(f"--blis-emulator-nice must be in -20..19, got {nice}")
    return BlisOptions(
        server_urls=tuple(u.rstrip("/") for u in urls),
        model=config.getoption("blis_model") or config.getini("blis_model") or None,
        # JSON given inline stays text (a Path would normalise the slashes inside it)
        kv_offload_config=(offload if offload.lstrip().startswith("{") else Path(offload)) if offload else None,
        kv_offloading_size=config.getoption("blis_kv_offloading_size"),
        tokenizer=str(Path(tok).expanduser().resolve()) if (tok := config.getoption("blis_tokenizer")) else "",
        vllm_commit=config.getoption("blis_vllm_commit"),
        hit_rate_tolerance_pp=tol,
        ttft_mape_threshold=mape,
        artifacts_dir=Path(artifacts).resolve(),
        kv_bytes_per_token=config.getoption("blis_kv_bytes_per_token") or 4096,
        emulator_profile=config.getoption("blis_emulator_profile"),
        emulator_seed=config.getoption("blis_emulator_seed") or 0,
        sim_total_kv_blocks=blocks,
        full_trace=config.getoption("blis_full_trace"),
        parallel_observe=config.getoption("blis_parallel_observe"),
        timing_report_only=config.getoption("blis_timing_report_only"),
        emulator_nice=nice,
    )
