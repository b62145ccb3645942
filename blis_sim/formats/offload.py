"""The KV offload config (``--kv-offload-config``, docs/reference-formats.md §6), resolved into
:class:`OffloadConfig`.

API::

    cfg = load_offload_config("offload.yaml", kv_bytes_per_token=163840)   # -> OffloadConfig (frozen, valid)
    cfg = load_offload_config(path, kv_bytes_per_token=..., gpu_block_size=16,
                              device_classes=load_device_classes("defaults.yaml"))   # classes optional
    cfg = resolve_offload_config(mapping, kv_bytes_per_token=..., file="<flag>")    # already-parsed YAML
    cfg = load_offload_config("ktc.json", kv_bytes_per_token=...)   # vllm serve's --kv-transfer-config (JSON/YAML)
    cfg = load_offload_config('{"kv_connector": ...}', kv_bytes_per_token=...)   # ... or the JSON itself
    cfg = load_offload_config(None, kv_bytes_per_token=..., kv_offloading_size=1.0)   # --kv-offloading-size GiB
    block = cfg.to_header()                      # -> TraceKVOffloadConfig (the trace header's kv_offload)
    ext = cfg.extensions()                       # -> OffloadExtensions | None (pytest_blis.offload)
    cfg2 = OffloadConfig.from_header(block, ext)  # header -> config; cfg2.equivalent(cfg) is True
    cfg.equivalent(other)                        # INV-13 comparison (per_block_bytes ignored, like BLIS)

:class:`OffloadConfig` — what the KV core and the emulator need, all resolved:

- ``gpu_block_size`` (tokens per GPU block), ``block_size`` (tokens per offload chunk =
  ``blocks_per_chunk × gpu_block_size``), ``blocks_per_chunk``, ``tokens_per_hash``.
- ``kv_bytes_per_token`` (per TP rank), ``bytes_per_chunk`` = ``int(kv_bytes_per_token × block_size)`` (the
  header's ``per_block_bytes``), ``cpu_bytes_to_use``, ``cpu_capacity_chunks`` = ``cpu_bytes_to_use //
  bytes_per_chunk`` (vLLM 0.33 sizes the CPU tier in chunks; its alignment round-up is not modelled).
  Caveat for TP > 1: vLLM divides ``cpu_bytes_to_use`` by the chunk size of *all* ranks (× world size), the
  reference by one rank's; both agree at TP = 1, the calibration setup. Pass ``kv_bytes_per_token × TP``
  to get vLLM's capacity.
- ``eviction_policy`` (``lru`` | ``arc``), ``offload_prompt_only`` (default true), ``store_threshold``
  (0 = off; values 0 and 1 are both "off" and resolve to 0; ≥2 = a chunk must be offered that many times before
  it is stored, only without secondary tiers, as vLLM's ``CPUOffloadingSpec``), ``self_describing_kv_events``.
- ``secondary_tiers``: tuple of :class:`TierConfig` (``fs`` only), each with ``read_bandwidth`` /
  ``write_bandwidth`` (bytes/µs), ``base_latency`` (µs), ``n_read_threads`` / ``n_write_threads``, the ramp
  (``saturation_queue_depth``, ``single_transfer_fraction``) and ``latency_jitter_stddev`` from the device
  class of the selected regime (``direct_io``), and ``max_bytes`` (our extension, vLLM PR #54327: the tier's
  capacity; ``None`` = unbounded) with ``capacity_chunks``; ``TierConfig.label(i)`` gives vLLM's tier label
  (``"1:fs"``).

Validation is the reference's (every message of docs/reference-formats.md §6.2, prefixed by the file, line
and field), plus the one config the reference accepts and then crashes on that we refuse: a CPU budget under
one chunk. The other two crash cases (``blocks_per_chunk > 1``, ``eviction_policy: arc``) are accepted: the
KV core supports both.
Errors: :class:`~blis_sim.errors.FormatError` for YAML/schema problems (unknown keys, duplicate keys, wrong
types), :class:`~blis_sim.errors.ConfigError` for values the resolver rejects; a file's problems are all
reported, several of them as one :class:`~blis_sim.errors.ConfigErrors`. vLLM's own forms (the
``--kv-transfer-config`` JSON, ``--kv-offloading-size``) are mapped onto the same block by
:mod:`blis_sim.formats.offload_vllm`.
"""

# No ``from __future__ import annotations``: pydantic would then evaluate each field's annotation string
# when the class is built. A method's annotation naming its own class is quoted.
import math
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from pydantic import Field, ValidationError, model_validator

from blis_sim import limits
from blis_sim._lazy import lazy_exports
from blis_sim.errors import ConfigError, ConfigErrors, InputError
from blis_sim.formats._model import StrictModel, construct, plain_fields
from blis_sim.formats._strict import YamlDoc
from blis_sim.formats.trace_header import CpuLink, OffloadExtensions, TraceKVOffloadConfig, TraceTierConfig

_INT64_MAX = 2**63 - 1
DEFAULT_GPU_BLOCK_SIZE = 16
DEFAULT_THREADS = 16


# --------------------------------------------------------------------------------------------- resolved


class TierConfig(StrictModel):
    """One resolved secondary tier (``fs``)."""

    # Constraints mirror the loader's checks, for configs built in code (the loader reports first, with the
    # reference's messages and the file's line).
    type: Literal["fs"] = "fs"
    root_dir: str = Field(min_length=1)
    n_read_threads: int = Field(default=DEFAULT_THREADS, ge=1)
    n_write_threads: int = Field(default=DEFAULT_THREADS, ge=1)
    locality: Literal["", "LOCAL", "REMOTE"] = ""
    enable_kv_events: bool = False
    direct_io: bool
    device_class: str = ""
    read_bandwidth: float = Field(gt=0, allow_inf_nan=False)
    write_bandwidth: float = Field(gt=0, allow_inf_nan=False)
    base_latency: float = Field(ge=0, allow_inf_nan=False)
    saturation_queue_depth: int = Field(default=1, ge=0)
    single_transfer_fraction: float = Field(default=1.0, allow_inf_nan=False)
    latency_jitter_stddev: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    max_bytes: int | None = Field(default=None, gt=0)

    @staticmethod
    def label(index: int) -> str:
        """vLLM's ``tier`` label of secondary tier ``index`` (0-based): ``"1:fs"`` for the first."""
        return f"{index + 1}:fs"

    def capacity_chunks(self, bytes_per_chunk: int) -> int | None:
        """Chunks the tier holds (``None`` = unbounded)."""
        return None if self.max_bytes is None else self.max_bytes // bytes_per_chunk


class OffloadConfig(StrictModel):
    """The resolved, validated offload config (see the module docstring)."""

    cpu_bytes_to_use: int = Field(gt=0)
    gpu_block_size: int = Field(gt=0)
    block_size: int = Field(gt=0)
    blocks_per_chunk: int = Field(gt=0)
    tokens_per_hash: int = Field(gt=0)
    eviction_policy: Literal["lru", "arc"] = "lru"
    offload_prompt_only: bool = True
    self_describing_kv_events: bool = False
    store_threshold: int = Field(default=0, ge=0)
    secondary_tiers: tuple[TierConfig, ...] = ()
    kv_bytes_per_token: float = Field(gt=0, allow_inf_nan=False)
    bytes_per_chunk: int = Field(gt=0)
    cpu_link: CpuLink | None = None  # None: the simulator's default CPU <-> GPU link

    @model_validator(mode="after")
    def _consistent(self) -> "OffloadConfig":
        if self.block_size != self.blocks_per_chunk * self.gpu_block_size:
            raise ValueError(f"block_size ({self.block_size}) must be blocks_per_chunk ({self.blocks_per_chunk}) "
                             f"x gpu_block_size ({self.gpu_block_size})")
        if self.cpu_bytes_to_use < self.bytes_per_chunk:
            raise ValueError(f"cpu_bytes_to_use ({self.cpu_bytes_to_use}) is smaller than one offload chunk "
                             f"({self.bytes_per_chunk} bytes)")
        if self.store_threshold >= 2 and self.secondary_tiers:
            raise ValueError("store_threshold >= 2 is not supported with secondary tiers")
        return self

    @property
    def cpu_capacity_chunks(self) -> int:
        return self.cpu_bytes_to_use // self.bytes_per_chunk

    @property
    def per_block_bytes(self) -> int:
        """The header's name for :attr:`bytes_per_chunk`."""
        return self.bytes_per_chunk

    def to_header(self) -> TraceKVOffloadConfig:
        """The trace header's ``kv_offload`` block (what the reference records for INV-13)."""
        return construct(
            TraceKVOffloadConfig, cpu_bytes_to_use=self.cpu_bytes_to_use, per_block_bytes=self.bytes_per_chunk,
            block_size=self.block_size, blocks_per_chunk=self.blocks_per_chunk,
            tokens_per_hash=self.tokens_per_hash, eviction_policy=self.eviction_policy,
            offload_prompt_only=self.offload_prompt_only, self_describing_kv_events=self.self_describing_kv_events,
            secondary_tiers=[construct(TraceTierConfig, **plain_fields(t, frozenset({"max_bytes"})))
                             for t in self.secondary_tiers])

    def extensions(self) -> OffloadExtensions | None:
        """What the reference's block cannot hold (``pytest_blis.offload``), or None if nothing."""
        max_bytes = [t.max_bytes for t in self.secondary_tiers]
        if self.store_threshold == 0 and all(b is None for b in max_bytes) and self.cpu_link is None:
            return None
        return OffloadExtensions(store_threshold=self.store_threshold,
                                 tier_max_bytes=max_bytes if any(b is not None for b in max_bytes) else [],
                                 cpu_link=self.cpu_link)

    @classmethod
    def from_header(cls, block: TraceKVOffloadConfig, extensions: OffloadExtensions | None = None, *,
                    kv_bytes_per_token: float | None = None, file: str | None = None) -> "OffloadConfig":
        """Rebuild the config a trace header recorded, validated as on load.

        ``kv_bytes_per_token`` is needed only when the block has ``per_block_bytes: 0``.
        """
        where = _Where(file, None, "kv_offload")
        if block.blocks_per_chunk <= 0:
            where.fail("blocks_per_chunk", f"kv_offload: blocks_per_chunk must be > 0, got {block.blocks_per_chunk}")
        if block.block_size <= 0 or block.block_size % block.blocks_per_chunk:
            where.fail("block_size", f"kv_offload: block_size ({block.block_size}) must be a positive multiple "
                                     f"of blocks_per_chunk ({block.blocks_per_chunk})")
        _check_bounds(where, per_block_bytes=block.per_block_bytes)  # before it is divided as a float
        where.check()
        if block.per_block_bytes > 0:
            kv_bytes_per_token = block.per_block_bytes / block.block_size
        elif kv_bytes_per_token is None:
            where.fail("per_block_bytes", "kv_offload: per_block_bytes is 0 and no kv_bytes_per_token was given")
        tier_max = extensions.tier_max_bytes if extensions is not None else []
        threshold = extensions.store_threshold if extensions is not None else 0
        if tier_max and len(tier_max) != len(block.secondary_tiers):
            where.fail("secondary_tiers", f"pytest_blis.offload.tier_max_bytes has {len(tier_max)} "
                                          f"entries for {len(block.secondary_tiers)} secondary tiers")
        tiers = []
        for i, t in enumerate(block.secondary_tiers):
            fields = plain_fields(t)
            if fields["type"] != "fs":
                where.fail(f"secondary_tiers.{i}.type",
                           f"kv_offload: secondary_tiers[{i}].type must be \"fs\", got {fields['type']!r}")
            fields["max_bytes"] = tier_max[i] if tier_max else None
            tiers.append(fields)
        gpu_bs = block.block_size // block.blocks_per_chunk
        assert kv_bytes_per_token is not None
        cfg = _build(cpu_bytes=block.cpu_bytes_to_use, gpu_bs=gpu_bs, block_size=block.block_size,
                     bpc=block.blocks_per_chunk, tph=block.tokens_per_hash, policy=block.eviction_policy,
                     prompt_only=block.offload_prompt_only, self_desc=block.self_describing_kv_events,
                     store_threshold=threshold, tiers=tiers, kv_bytes_per_token=kv_bytes_per_token,
                     where=where, cpu_link=extensions.cpu_link if extensions is not None else None)
        if block.per_block_bytes > 0 and cfg.bytes_per_chunk != block.per_block_bytes:
            # int(kv_bytes_per_token × block_size) can round differently: the recorded value is authoritative.
            cfg = cfg.model_copy(update={"bytes_per_chunk": block.per_block_bytes})
        return cfg

    def equivalent(self, other: "OffloadConfig") -> bool:
        """Same config for INV-13 (``per_block_bytes`` ignored, as the reference's reconcile does)."""
        a = self.to_header().model_copy(update={"per_block_bytes": 0})
        b = other.to_header().model_copy(update={"per_block_bytes": 0})
        return a == b and self.extensions() == other.extensions()


# --------------------------------------------------------------------------------------------- resolution


class _Where:
    """Turns a field path into file:line for errors, and collects them: :meth:`add` records a problem and
    goes on, :meth:`check` raises what was recorded (one error as itself, several as
    :class:`~blis_sim.errors.ConfigErrors`), :meth:`fail` records and raises."""

    def __init__(self, file: str | None, doc: YamlDoc | None, root: str) -> None:
        self.file, self.doc, self.root = file, doc, root
        self.problems: list[InputError] = []
        #: field paths (dotted, under ``root``) whose value was dropped by a schema error: a value check of
        #: them or of anything under them would report a consequence, not a problem of the file
        self.dropped: set[str] = set()

    def add(self, field: str, message: str) -> None:
        dotted = f"{self.root}.{field}".strip(".")
        if any(dotted == d or dotted.startswith(d + ".") for d in self.dropped):
            return
        path = tuple(int(p) if p.isdigit() else p for p in dotted.split(".") if p)
        line = self.doc.line_of(path) if self.doc is not None else None
        err = ConfigError(message, file=self.file, line=line, field=".".join(str(p) for p in path))
        if not any(str(e) == str(err) for e in self.problems):
            self.problems.append(err)

    def check(self) -> None:
        if not self.problems:
            return
        problems = sorted(self.problems, key=lambda e: e.location.line or 0)
        if len(problems) == 1:
            raise problems[0]
        raise ConfigErrors(problems, file=self.file)

    def fail(self, field: str, message: str) -> NoReturn:
        self.add(field, message)
        self.check()
        raise ConfigError(message, file=self.file)  # only reached for a field a schema error already dropped


def _build(*, cpu_bytes: int, gpu_bs: int, block_size: int, bpc: int, tph: int, policy: str, prompt_only: bool,
           self_desc: bool, store_threshold: int, tiers: list[dict[str, Any]], kv_bytes_per_token: float,
           where: _Where, cpu_link: CpuLink | None = None) -> OffloadConfig:
    """The reference's ``Validate()`` plus our refusal of a CPU budget under one chunk, and the maxima of
    :mod:`blis_sim.limits` on every size that reaches the compiled core."""
    _check_bounds(where, cpu_bytes_to_use=cpu_bytes, block_size=block_size, blocks_per_chunk=bpc,
                  tokens_per_hash=tph, store_threshold=store_threshold)
    if cpu_bytes <= 0:
        where.add("cpu_bytes_to_use", f"kv_offload: cpu_bytes_to_use must be > 0 when offload is enabled, "
                                      f"got {cpu_bytes}")
    if tph <= 0:
        where.add("tokens_per_hash", f"kv_offload: tokens_per_hash must be > 0, got {tph}")
    if policy not in ("lru", "arc"):
        where.add("eviction_policy", f"kv_offload: eviction_policy must be \"lru\" or \"arc\", got {policy!r}")
    for i, t in enumerate(tiers):
        _check_tier(i, t, where)
    bytes_per_chunk = 0
    if not (kv_bytes_per_token > 0 and math.isfinite(kv_bytes_per_token)):
        where.add("per_block_bytes", f"kv_offload: derived per_block_bytes must be > 0 (kv_bytes_per_token="
                                     f"{kv_bytes_per_token})")
    else:
        bytes_per_chunk = int(kv_bytes_per_token * block_size)
        if bytes_per_chunk > limits.MAX_BYTES:
            where.add("per_block_bytes",
                      f"kv_offload: derived per_block_bytes {limits.over(bytes_per_chunk, limits.MAX_BYTES)}")
        elif bytes_per_chunk <= 0:
            where.add("per_block_bytes", f"kv_offload: derived per_block_bytes must be > 0 (kv_bytes_per_token="
                                         f"{kv_bytes_per_token} × block_size {block_size})")
        else:
            if 0 < cpu_bytes < bytes_per_chunk:
                # The reference accepts this and then panics building the cache
                # (docs/reference-formats.md §6.3): a CPU tier must hold a chunk.
                where.add("cpu_bytes_to_use",
                          f"kv_offload: cpu_bytes_to_use ({cpu_bytes}) is smaller than one offload chunk "
                          f"({bytes_per_chunk} bytes = {block_size} tokens × {kv_bytes_per_token:g} bytes/token): "
                          f"the CPU tier could hold nothing; give at least {bytes_per_chunk} bytes")
            for i, t in enumerate(tiers):
                if t["max_bytes"] is not None and 0 < t["max_bytes"] < bytes_per_chunk:
                    where.add(f"secondary_tiers.{i}.max_bytes",
                              f"kv_offload: secondary_tiers[{i}].max_bytes ({t['max_bytes']}) is smaller than one "
                              f"offload chunk ({bytes_per_chunk} bytes); omit it for an unbounded tier")
    where.check()
    resolved = []
    for i, t in enumerate(tiers):  # what the checks above do not cover (a header's empty root_dir, ...)
        try:
            resolved.append(construct(TierConfig, **t))
        except ValidationError as exc:
            _fail_validation(where, exc, f"secondary_tiers.{i}.", f"secondary_tiers[{i}].")
    try:
        return construct(OffloadConfig, cpu_bytes_to_use=cpu_bytes, gpu_block_size=gpu_bs, block_size=block_size,
                         blocks_per_chunk=bpc, tokens_per_hash=tph, eviction_policy=policy,
                         offload_prompt_only=prompt_only, self_describing_kv_events=self_desc,
                         store_threshold=store_threshold if store_threshold >= 2 else 0,
                         secondary_tiers=tuple(resolved),
                         kv_bytes_per_token=float(kv_bytes_per_token), bytes_per_chunk=bytes_per_chunk,
                         cpu_link=cpu_link)
    except ValidationError as exc:
        _fail_validation(where, exc, "", "")


def _fail_validation(where: _Where, exc: ValidationError, field: str, label: str) -> NoReturn:
    err = exc.errors(include_url=False)[0]
    name = ".".join(str(p) for p in err["loc"])
    where.fail(field + name, f"kv_offload: {label}{name}: {err['msg']} (got {err.get('input')!r})")


_MAXIMA = {"cpu_bytes_to_use": limits.MAX_BYTES, "block_size": limits.MAX_BLOCK_TOKENS,
           "blocks_per_chunk": limits.MAX_BLOCK_TOKENS, "tokens_per_hash": limits.MAX_BLOCK_TOKENS,
           "store_threshold": limits.MAX_QUEUE_DEPTH, "n_read_threads": limits.MAX_THREADS,
           "n_write_threads": limits.MAX_THREADS, "saturation_queue_depth": limits.MAX_QUEUE_DEPTH,
           "max_bytes": limits.MAX_BYTES, "per_block_bytes": limits.MAX_BYTES}


def _check_bounds(where: _Where, tier: int | None = None, **values: int | None) -> None:
    """Every value within its maximum (``tier``: the values are secondary tier ``tier``'s)."""
    field = "" if tier is None else f"secondary_tiers.{tier}."
    label = "" if tier is None else f"secondary_tiers[{tier}]."
    for name, value in values.items():
        reason = None if value is None else limits.over(value, _MAXIMA[name])
        if reason:
            where.add(field + name, f"kv_offload: {label}{name} {reason}")


def _check_tier(i: int, t: dict[str, Any], where: _Where) -> None:
    f, p = f"secondary_tiers.{i}", f"kv_offload: secondary_tiers[{i}]"
    _check_bounds(where, i, n_read_threads=t["n_read_threads"], n_write_threads=t["n_write_threads"],
                  saturation_queue_depth=t["saturation_queue_depth"], max_bytes=t["max_bytes"])
    if t["locality"] not in ("", "LOCAL", "REMOTE"):
        where.add(f + ".locality", f"{p}.locality must be \"LOCAL\" or \"REMOTE\" (or unset), got {t['locality']!r}")
    for name in ("n_read_threads", "n_write_threads"):
        if t[name] <= 0:
            where.add(f"{f}.{name}", f"{p}.{name} must be > 0, got {t[name]}")
    for name in ("read_bandwidth", "write_bandwidth"):
        if not (math.isfinite(t[name]) and t[name] > 0):
            where.add(f"{f}.{name}", f"{p}.{name} must be a finite value > 0, got {t[name]:g}")
    if not (math.isfinite(t["base_latency"]) and t["base_latency"] >= 0):
        where.add(f + ".base_latency", f"{p}.base_latency must be a finite value >= 0, got {t['base_latency']:g}")
    if t["saturation_queue_depth"] < 0:
        where.add(f + ".saturation_queue_depth",
                   f"{p}.saturation_queue_depth must be >= 0, got {t['saturation_queue_depth']}")
    f1 = t["single_transfer_fraction"]
    if not math.isfinite(f1):
        where.add(f + ".single_transfer_fraction", f"{p}.single_transfer_fraction must be a finite value, got {f1:g}")
    if t["saturation_queue_depth"] >= 2 and not 0 < f1 <= 1:
        where.add(f + ".single_transfer_fraction",
                   f"{p}.single_transfer_fraction must be in (0,1] when saturation_queue_depth >= 2, got {f1:g}")
    if not (math.isfinite(t["latency_jitter_stddev"]) and t["latency_jitter_stddev"] >= 0):
        where.add(f + ".latency_jitter_stddev",
                   f"{p}.latency_jitter_stddev must be a finite value >= 0, got {t['latency_jitter_stddev']:g}")
    if t["max_bytes"] is not None and t["max_bytes"] <= 0:
        where.add(f + ".max_bytes", f"{p}.max_bytes must be > 0 (or omitted for an unbounded tier), "
                                     f"got {t['max_bytes']}")


__all__ = ["DEFAULT_DEVICE_CLASSES", "DEFAULT_GPU_BLOCK_SIZE", "DeviceClass", "OffloadConfig", "TierConfig",
           "load_device_classes", "load_offload_config", "parse_offload_config", "resolve_offload_config"]

# The file loader (``--kv-offload-config``, ``defaults.yaml``) and its models live in
# :mod:`blis_sim.formats.offload_file`: a replay of a trace whose header records the config never
# reads one, and does not build those classes. Its names are still served from here (PEP 562).
_FILE_NAMES = frozenset({"DEFAULT_DEVICE_CLASSES", "DeviceClass", "INLINE", "is_inline", "load_device_classes",
                         "load_offload_config", "parse_offload_config", "resolve_offload_config"})


__getattr__ = lazy_exports(__name__, {"blis_sim.formats.offload_file": tuple(sorted(_FILE_NAMES))})[0]

if TYPE_CHECKING:  # the names served lazily above, as the type checker sees them
    from blis_sim.formats.offload_file import (
        DEFAULT_DEVICE_CLASSES as DEFAULT_DEVICE_CLASSES,
        INLINE as INLINE,
        DeviceClass as DeviceClass,
        is_inline as is_inline,
        load_device_classes as load_device_classes,
        load_offload_config as load_offload_config,
        parse_offload_config as parse_offload_config,
        resolve_offload_config as resolve_offload_config,
    )
