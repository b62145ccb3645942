"""The simulator's settings, resolved once: :func:`resolve_settings` is the one function that turns
what a caller gave into the values a simulation runs on, and says where each came from.

Every caller goes through it: ``blis run`` / ``replay`` / ``fit`` (:func:`blis_sim.engine.cli.options_from_args`),
``blis sweep`` and ``blis plan`` (their base, then each point's axes as flags: :func:`with_flags`), the
pytest plugin (``pytest_blis._replay``), and the library's ``replay_outcome`` / ``run_outcome`` / ``fit``,
which resolve whatever the options leave open against the trace they were given.

Each setting is taken from the first that gives it (the table: docs/engine.md, "Settings, resolved once"):

* ``block_size``: the flag; the header's ``pytest_blis.kv_geometry``, ``server.block_size`` or ``kv_offload``
  block; a given offload config's GPU block; 16.
* ``num_gpu_blocks``: the flag; ``pytest_blis.kv_geometry``; the model's capacity on ``hardware``; 1,000,000.
* ``max_num_seqs``: the flag; ``server.max_num_seqs``; 256. ``max_num_batched_tokens``: the flag; 2048.
  ``long_prefill_token_threshold``: the flag; 0.
* ``latency_model``: the given model (``--latency-model roofline`` is the model's); the bundled coefficients.
* ``kv_bytes_per_token``: the flag; the header's ``kv_offload.per_block_bytes``; the model's geometry; none.
* ``kv_offload``: the header's block (authoritative, INV-13); the flag (an observed trace only); none.

The defaults are :mod:`blis_sim.defaults` (each with its reason). A flag (``flag``) is anything the
caller set: a CLI flag, a sweep point's axis, and in the plugin the server target's geometry and offload
tiers, the scenario's ``server:`` limits and the probe's fitted latency model. The resolved
:class:`~blis_sim.engine.EngineOptions` carry ``sources`` (setting → ``flag`` / ``header`` / ``model`` /
``default``), which the outputs' provenance records (:func:`blis_sim.engine.provenance.settings_info`).
Resolving resolved options again (with the same header) changes nothing: a value keeps its source.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from blis_sim.defaults import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_HARDWARE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_TOTAL_KV_BLOCKS,
)
from blis_sim.engine.latency import default_step_model
from blis_sim.engine.models import default_num_gpu_blocks, geometry_for
from blis_sim.errors import ConfigError, InputError, UsageError
from blis_sim.formats.offload import OffloadConfig

if TYPE_CHECKING:
    from blis_sim.engine.latency import ModelGeometry
    from blis_sim.engine.simulate import EngineOptions
    from blis_sim.formats.trace_header import TraceHeader, TraceKVOffloadConfig

Source = Literal["flag", "header", "model", "default"]

#: the settings whose source is recorded (the provenance writes them by name, sorted)
SETTINGS = ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens",
            "long_prefill_token_threshold", "latency_model", "kv_bytes_per_token", "kv_offload")

#: EngineOptions field → the setting it is (the latency object is the ``latency_model`` setting)
_FIELDS = {"block_size": "block_size", "num_gpu_blocks": "num_gpu_blocks", "max_num_seqs": "max_num_seqs",
           "max_num_batched_tokens": "max_num_batched_tokens",
           "long_prefill_token_threshold": "long_prefill_token_threshold", "latency": "latency_model",
           "kv_bytes_per_token": "kv_bytes_per_token", "kv_offload": "kv_offload"}

#: how the warning on an observed trace names a defaulted limit (the flag that would set it)
_FLAG_NAMES = {"max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
               "num_gpu_blocks": "--total-kv-blocks"}


@dataclass(frozen=True)
class OffloadFlags:
    """The offload tiers as flags give them (``--kv-offload-config``, ``--kv-offloading-size``, ...):
    loaded only once the GPU block size and the KV bytes per token are resolved, which sizing it needs."""

    config: str | None = None           # a file, or the JSON of vllm serve's --kv-transfer-config
    offloading_size: float | None = None
    offloading_backend: str | None = None
    defaults_filepath: str | None = None  # a defaults.yaml with kv_offload_devices
    command: str = "run"                # names the warnings: "blis <command>: warning: ..."

    @property
    def given(self) -> bool:
        return bool(self.config) or self.offloading_size is not None

    def load(self, *, block_size: int, kv_bytes_per_token: float | None) -> OffloadConfig:
        # the file loader (formats/offload_file.py) only when a flag names a config: a replay whose
        # header records it never builds the loader's models
        from blis_sim.formats.offload import load_device_classes, load_offload_config

        if kv_bytes_per_token is None:
            raise UsageError("kv_offload: cannot derive per_block_bytes from the model: pass "
                             "--model-config config.json or a bundled --model "
                             "(qwen/qwen3-14b, meta-llama/llama-3.1-8b-instruct, tiny-llama)")
        kwargs: dict[str, Any] = {"kv_bytes_per_token": kv_bytes_per_token, "gpu_block_size": block_size}
        if self.defaults_filepath:
            kwargs["device_classes"] = load_device_classes(self.defaults_filepath)
        return load_offload_config(
            self.config or None, kv_offloading_size=self.offloading_size,
            kv_offloading_backend=self.offloading_backend,
            warn=lambda m: print(f"blis {self.command}: warning: {m}", file=sys.stderr), **kwargs)


def resolve_settings(options: EngineOptions, header: TraceHeader | None = None, *,
                     offload_flags: OffloadFlags | None = None,
                     warn: Callable[[str], None] | None = None, trace_name: str | None = None) -> EngineOptions:
    """``options`` with every setting resolved (flag, then ``header``, then the model, then the
    documented default; the module docstring) and ``sources`` saying which gave each.

    ``None`` in ``options`` means "not given". ``offload_flags``: offload tiers still to be loaded
    (the CLI's flags). The header's offload rules apply (docs/reference-formats.md §4.3, INV-13):
    a recorded ``kv_offload`` block is authoritative and a flag that resolves differently is an error.
    ``warn``: called once, on an observed trace (``mode: real``), naming the server limits that came
    from neither a flag nor the header (they set the server's capacity; the CLI prints it).
    ``trace_name``: names the trace (its files) in an error about what its header holds.
    """
    src: dict[str, str] = dict(options.sources)

    def pick(setting: str, *candidates: tuple[Any, str]) -> Any:
        """The first candidate that is not None; a value the caller gave is a flag."""
        for value, source in candidates:
            if value is not None:
                src[setting] = src.get(setting, "flag") if source == "flag" else source
                return value
        return None

    server = header.server if header is not None else None
    kv_geom = header.pytest_blis.kv_geometry if header is not None and header.pytest_blis is not None else None
    recorded = header.kv_offload if header is not None else None
    model = _Model(options)

    block_size = int(pick(
        "block_size", (options.block_size, "flag"),
        (kv_geom.block_size or None if kv_geom is not None else None, "header"),
        (server.block_size or None if server is not None else None, "header"),
        (_offload_gpu_block_size(recorded), "header"),
        (options.kv_offload.gpu_block_size if options.kv_offload is not None else None, "flag"),
        (DEFAULT_BLOCK_SIZE, "default")))
    hardware = options.hardware or DEFAULT_HARDWARE
    blocks = options.num_gpu_blocks
    if blocks is None and not (kv_geom is not None and kv_geom.num_gpu_blocks):
        capacity = model.capacity(block_size, hardware)  # only when needed: it may read a config.json
    else:
        capacity = None
    blocks = pick("num_gpu_blocks", (blocks, "flag"),
                  (kv_geom.num_gpu_blocks or None if kv_geom is not None else None, "header"),
                  (capacity, "model"), (DEFAULT_TOTAL_KV_BLOCKS, "default"))
    seqs = pick("max_num_seqs", (options.max_num_seqs, "flag"),
                (server.max_num_seqs or None if server is not None else None, "header"),
                (DEFAULT_MAX_NUM_SEQS, "default"))
    tokens = pick("max_num_batched_tokens", (options.max_num_batched_tokens, "flag"),
                  (DEFAULT_MAX_NUM_BATCHED_TOKENS, "default"))
    threshold = pick("long_prefill_token_threshold", (options.long_prefill_token_threshold, "flag"),
                     (0, "default"))
    latency, latency_source = pick("latency_model", (
        (options.latency, options.latency_source) if options.latency is not None else None, "flag"),
        ((default_step_model(), "default"), "default"))

    per_block = (recorded.per_block_bytes / recorded.block_size
                 if recorded is not None and recorded.per_block_bytes and recorded.block_size else None)
    kvb = pick("kv_bytes_per_token", (options.kv_bytes_per_token, "flag"), (per_block, "header"),
               (model.kv_bytes_per_token() if options.kv_bytes_per_token is None and per_block is None
                else None, "model"))
    if kvb is None:
        src["kv_bytes_per_token"] = "default"  # none: only an offload tier needs it

    offload = pick("kv_offload", (options.kv_offload, "flag"))
    if offload is None and offload_flags is not None and offload_flags.given:
        offload = offload_flags.load(block_size=block_size, kv_bytes_per_token=kvb)
        src["kv_offload"] = "flag"
    if header is not None:
        try:
            chosen = resolve_offload(header, offload, kv_bytes_per_token=kvb)
        except InputError as exc:  # what the trace holds (INV-13): name the trace
            if trace_name is None or exc.location.file is not None:
                raise
            raise type(exc)(exc.reason, file=trace_name, line=exc.location.line,
                            field=exc.location.field) from None
        if offload is None and chosen is not None:
            src["kv_offload"] = "header"
        offload = chosen
    if offload is None:
        src["kv_offload"] = "default"  # GPU prefix cache only

    resolved = replace(options, block_size=block_size, num_gpu_blocks=int(blocks), max_num_seqs=int(seqs),
                       max_num_batched_tokens=int(tokens), long_prefill_token_threshold=int(threshold),
                       latency=latency, latency_source=latency_source, kv_bytes_per_token=kvb,
                       kv_offload=offload, sources={k: src[k] for k in SETTINGS})
    if warn is not None and header is not None and header.mode == "real":
        _warn_defaults(resolved, hardware, warn)
    return resolved


class _Model:
    """The model's geometry (``--model-config``, else a bundled ``--model``), read on first use."""

    def __init__(self, options: EngineOptions) -> None:
        self._options = options
        self._geometry: ModelGeometry | None = None
        self._read = False

    def geometry(self) -> ModelGeometry | None:
        if not self._read:
            self._geometry = geometry_for(self._options.model, self._options.model_config)
            self._read = True
        return self._geometry

    def capacity(self, block_size: int, hardware: str) -> int | None:
        geom = self.geometry()
        if geom is None:
            return None
        return default_num_gpu_blocks(self._options.model, block_size, hardware=hardware, tp=self._options.tp,
                                      geometry=geom)

    def kv_bytes_per_token(self) -> float | None:
        geom = self.geometry()
        return geom.kv_bytes_per_token(self._options.tp) if geom is not None else None


def resolve_offload(header: TraceHeader, flag_cfg: OffloadConfig | None, *,
                    kv_bytes_per_token: float | None) -> OffloadConfig | None:
    """The offload config a replay of ``header``'s trace uses (docs/reference-formats.md §4.3), or None:
    the header's recorded block (authoritative: a flag that resolves differently is an error, INV-13),
    else a flag's, which only an observed trace (``mode: real``) may take."""
    recorded = None
    if header.kv_offload is not None:
        ext = header.pytest_blis.offload if header.pytest_blis is not None else None
        try:
            recorded = OffloadConfig.from_header(header.kv_offload, ext,
                                                 kv_bytes_per_token=kv_bytes_per_token)
        except ConfigError as exc:
            raise ConfigError(f"blis replay cannot reproduce the trace's kv_offload config: "
                              f"{exc.reason} (INV-13: never silent degradation)",
                              field=exc.location.field) from None
    if recorded is not None:
        if flag_cfg is not None and not flag_cfg.equivalent(recorded):
            raise UsageError("--kv-offload-config conflicts with the kv_offload config recorded in "
                             "the trace header; on replay the header is authoritative — omit the "
                             "flag or pass the identical config")
        return recorded
    if flag_cfg is not None:
        if header.mode != "real":
            raise UsageError(
                "the trace was captured without a kv_offload config; --kv-offload-config cannot "
                "add one on replay of a sim-generated trace (INV-13). Only observe traces (mode "
                '"real") may have an offload config supplied on replay to model the observed '
                "deployment")
        return flag_cfg
    return None


def with_flags(options: EngineOptions, **changes: Any) -> EngineOptions:
    """``options`` with ``changes`` (EngineOptions fields) set as flags: a sweep point's axes."""
    sources = dict(options.sources)
    for name in changes:
        if name in _FIELDS:
            sources[_FIELDS[name]] = "flag"
    return replace(options, **changes, sources=sources)


def _offload_gpu_block_size(block: TraceKVOffloadConfig | None) -> int | None:
    """The GPU block size a header's ``kv_offload`` block was recorded for (its chunk over its blocks)."""
    if block is None or block.blocks_per_chunk <= 0 or block.block_size <= 0:
        return None
    return int(block.block_size // block.blocks_per_chunk) or None


def _warn_defaults(options: EngineOptions, hardware: str, warn: Callable[[str], None]) -> None:
    used = []
    for setting in ("max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks"):
        source = options.sources[setting]
        value = getattr(options, setting)
        if source == "model":
            used.append(f"{_FLAG_NAMES[setting]} {value} (the model's capacity on {hardware})")
        elif source == "default":
            used.append(f"{_FLAG_NAMES[setting]} {value}")
    if used:
        warn("the trace header does not give the server's limits and no flag did; running on defaults "
             + ", ".join(used))
