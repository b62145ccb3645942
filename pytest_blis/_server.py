"""Server targets: an external vLLM URL, or an embedded emulator spawned for the scenario's server.

Embedded emulators run as subprocesses (so the client measuring TTFT never shares a GIL with the
server it measures), one per distinct server spec per worker, started on a free loopback port when
first needed and stopped by PID at the end of the session. External servers are shared out among
xdist workers round-robin; a lock file per URL keeps two workers' traffic out of one counter window.

Embedded emulators share the machine with the client that times them, so by default every worker's
observation windows (probe and cells) take one host-wide lock: TTFT is never measured while another
worker's emulator is being driven (replay and calibrate still run in parallel).
``--blis-parallel-observe`` lifts that for runs that only care about hit-rates.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from blis_sim.errors import ServerError
from blis_sim.formats.offload import OffloadConfig, is_inline, load_offload_config
from pytest_blis._options import BlisOptions
from pytest_blis._scenario import Capacity, ServerSpec
from pytest_blis._session import SessionState, worker_index

if TYPE_CHECKING:
    from blis_sim.routing import RoutingSpec


@dataclass(frozen=True)
class ServerTarget:
    """A server a cell runs against, and what the simulator must know to replay it."""

    url: str
    model: str
    embedded: bool
    block_size: int
    num_gpu_blocks: int
    offload: OffloadConfig | None  # the offload config replay uses (None: GPU only)
    offload_path: Path | str | None  # str: vllm serve's --kv-transfer-config JSON, given inline
    lock_dir: Path
    capabilities: frozenset[str] = field(default_factory=frozenset)  # "cpu", "storage"
    namespace: str = ""  # mixed into prompt content (see SessionState.namespace)
    lock_name: str = ""  # the lock file exclusive() takes (default: one per URL)
    tokenizer: str = ""  # the served model's tokenizer: observe and the probe build prompts with it
    urls: tuple[str, ...] = ()  # a cluster: every replica's URL (``url`` is the first); () = one server
    routing: RoutingSpec | None = None  # a cluster's client-side routing

    @property
    def cluster(self) -> bool:
        return len(self.urls) > 1

    @property
    def key(self) -> str:
        return hashlib.sha1(self.url.encode()).hexdigest()[:12]

    def capacity(self) -> Capacity:
        cpu = None
        if self.offload is not None:
            cpu = self.offload.cpu_capacity_chunks * self.offload.block_size
        return Capacity(gpu_tokens=self.block_size * self.num_gpu_blocks, cpu_tokens=cpu)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the server for one counter window (no-op cost for a per-worker emulator)."""
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        with open(self.lock_dir / (self.lock_name or f"server-{self.key}.lock"), "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _get_json(url: str, timeout: float = 10.0) -> object:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError) as exc:
        raise ServerError(f"cannot read {url}: {exc}") from None


def _geometry(url: str) -> tuple[int, int]:
    """Block size and GPU blocks from ``vllm:cache_config_info`` (0, 0 when the server hides them)."""
    from blis_sim.observe.metrics import kv_geometry, parse_exposition  # heavy import, only when needed

    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError as exc:
        raise ServerError(f"cannot read /metrics: {exc}", url=url) from None
    geo = kv_geometry(parse_exposition(text)) or {}
    return int(geo.get("block_size") or 0), int(geo.get("num_gpu_blocks") or 0)


def _offload_for(spec: ServerSpec, base_dir: Path) -> tuple[OffloadConfig | None, Path | str | None]:
    if spec.offload is None:
        return None, None
    source = spec.offload if is_inline(spec.offload) else (base_dir / spec.offload).resolve()
    return load_offload_config(source, gpu_block_size=spec.block_size, kv_bytes_per_token=spec.kv_bytes_per_token,
                               warn=_warn), source


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=2)


def _capabilities(offload: OffloadConfig | None) -> frozenset[str]:
    if offload is None:
        return frozenset()
    return frozenset({"cpu"} | ({"storage"} if offload.secondary_tiers else set()))


class ServerPool:
    """The targets of one worker: embedded emulators by server spec, or the external URLs."""

    def __init__(self, options: BlisOptions, state: SessionState) -> None:
        self.options = options
        self.state = state
        self._embedded: dict[tuple[ServerSpec, Path], ServerTarget] = {}
        self._external: ServerTarget | None = None

    def target(self, spec: ServerSpec, base_dir: Path) -> ServerTarget:
        if self.options.embedded:
            # cells that differ only in routing share the cluster's emulators
            key = (spec.model_copy(update={"routing_policy": "round-robin", "routing_scorers": ""}), base_dir)
            if key not in self._embedded:
                self._embedded[key] = self._spawn(spec, base_dir)
            target = self._embedded[key]
            return dataclasses.replace(target, routing=spec.routing()) if target.cluster else target
        if spec.replicas > 1:
            raise ServerError("a cluster scenario (server.replicas > 1) runs on the embedded emulator only: "
                              "observing several external servers from a scenario is not built yet "
                              "(use blis observe --server-url once per replica; docs/cluster.md §6)")
        if self._external is None:
            self._external = self._connect()
        return self._external

    def _spawn(self, spec: ServerSpec, base_dir: Path) -> ServerTarget:
        from blis_sim.emulator import EmulatorConfig, spawn_emulator

        offload, path = _offload_for(spec, base_dir)
        if spec.replicas > 1 and offload is not None and offload.secondary_tiers:
            raise ServerError("a cluster's replicas would share the fs tier's root_dir: server.replicas > 1 "
                              "takes a CPU-only offload config (docs/cluster.md §6)")
        tokenizer = self.options.tokenizer or (str((base_dir / spec.tokenizer).expanduser().resolve())
                                               if spec.tokenizer else "")
        config = EmulatorConfig(
            profile=self.options.emulator_profile or spec.profile, block_size=spec.block_size,
            num_gpu_blocks=spec.num_gpu_blocks, kv_bytes_per_token=spec.kv_bytes_per_token,
            max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens,
            kv_offload_config=str(path) if path else None, metrics_profile=spec.metrics_profile,
            enable_prompt_tokens_details=True, seed=self.options.emulator_seed, nice=self.options.emulator_nice,
            tokenizer=tokenizer or None)
        proc = spawn_emulator(config, replicas=spec.replicas)
        if proc.niceness != config.nice:
            warnings.warn(f"embedded emulator ({config.profile}) runs at niceness {proc.niceness}, not "
                          f"{config.nice}: raising its priority needs root or CAP_SYS_NICE. Other jobs on this "
                          "machine can then delay its steps and move TTFT verdicts (--blis-emulator-nice).",
                          stacklevel=1)
        self.state.closers.append(proc.stop)
        return ServerTarget(url=proc.url, model=config.model, embedded=True, block_size=spec.block_size,
                            num_gpu_blocks=spec.num_gpu_blocks, offload=offload, offload_path=path,
                            lock_dir=self.options.artifacts_dir / ".locks",
                            capabilities=_capabilities(offload), tokenizer=tokenizer,
                            lock_name="" if self.options.parallel_observe else "embedded-host.lock",
                            urls=tuple(proc.urls) if spec.replicas > 1 else (),
                            routing=spec.routing() if spec.replicas > 1 else None)

    def _connect(self) -> ServerTarget:
        urls = self.options.server_urls
        url = urls[worker_index() % len(urls)]
        model = self.options.model
        if not model:
            data = _get_json(f"{url}/v1/models")
            try:
                model = data["data"][0]["id"]  # type: ignore[index]
            except (KeyError, IndexError, TypeError):
                raise ServerError("/v1/models lists no model; pass --blis-model", url=url) from None
        block_size, blocks = _geometry(url)
        if not block_size or not blocks:
            raise ServerError("vllm:cache_config_info does not give block_size and num_gpu_blocks", url=url)
        offload = path = None
        source, size = self.options.kv_offload_config, self.options.kv_offloading_size
        if source is not None or size is not None:
            path = source.resolve() if isinstance(source, Path) else source
            offload = load_offload_config(path, gpu_block_size=block_size, kv_offloading_size=size,
                                          kv_bytes_per_token=self.options.kv_bytes_per_token, warn=_warn)
        return ServerTarget(url=url, model=str(model), embedded=False, block_size=block_size,
                            num_gpu_blocks=blocks, offload=offload, offload_path=path,
                            lock_dir=self.options.artifacts_dir / ".locks", capabilities=_capabilities(offload),
                            namespace=self.state.namespace, tokenizer=self.options.tokenizer)
