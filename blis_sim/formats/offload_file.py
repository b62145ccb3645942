"""The offload config file (``--kv-offload-config``) and the device classes of a ``defaults.yaml``:
read, checked with the reference's messages and resolved into :class:`~blis_sim.formats.offload.OffloadConfig`.

The API is :mod:`blis_sim.formats.offload`'s (``load_offload_config``, ``parse_offload_config``,
``resolve_offload_config``, ``load_device_classes``, ``DeviceClass``, ``DEFAULT_DEVICE_CLASSES``; its
docstring has the rules); those names are served from there. This module holds the file's models so
that a replay whose trace header records its config (the header is authoritative) does not build them.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field

from blis_sim.errors import ConfigError
from blis_sim.formats._model import StrictModel, construct
from blis_sim.formats._strict import YamlDoc, load_yaml, parse_yaml, validate
from blis_sim.formats.offload import (_INT64_MAX, DEFAULT_GPU_BLOCK_SIZE, DEFAULT_THREADS, OffloadConfig, _build,
                                      _Where)

# --------------------------------------------------------------------------------------------- device classes


class DeviceClass(StrictModel):
    """A storage device class (``defaults.yaml: kv_offload_devices``): bytes/µs and µs.

    ``buffered_*`` values apply when a tier has ``direct_io: false``; absent ones fall back to the O_DIRECT value.
    """

    read_bandwidth: float
    write_bandwidth: float
    base_latency: float
    saturation_queue_depth: int | None = None
    single_transfer_fraction: float | None = None
    latency_jitter_stddev: float | None = None
    buffered_read_bandwidth: float | None = None
    buffered_write_bandwidth: float | None = None
    buffered_base_latency: float | None = None
    buffered_saturation_queue_depth: int | None = None
    buffered_single_transfer_fraction: float | None = None
    buffered_latency_jitter_stddev: float | None = None

    def regime(self, direct_io: bool) -> dict[str, Any]:
        """The six device numbers for O_DIRECT (``direct_io``) or buffered I/O, defaults applied."""
        names = ("read_bandwidth", "write_bandwidth", "base_latency", "saturation_queue_depth",
                 "single_transfer_fraction", "latency_jitter_stddev")
        out = {n: getattr(self, n) for n in names}
        if not direct_io:
            for n in names:
                b = getattr(self, "buffered_" + n)
                if b is not None:
                    out[n] = b
        defaults = {"saturation_queue_depth": 1, "single_transfer_fraction": 1.0, "latency_jitter_stddev": 0.0}
        return {n: (defaults[n] if v is None and n in defaults else v) for n, v in out.items()}


#: The reference's shipped classes (defaults.yaml): none enables the ramp or jitter.
DEFAULT_DEVICE_CLASSES: Mapping[str, DeviceClass] = {
    "nvme_gen4": construct(DeviceClass, read_bandwidth=7000.0, write_bandwidth=5000.0, base_latency=80.0),
    "nvme_gen3": construct(DeviceClass, read_bandwidth=3500.0, write_bandwidth=3000.0, base_latency=100.0),
    "sata_ssd": construct(DeviceClass, read_bandwidth=550.0, write_bandwidth=500.0, base_latency=150.0),
    "cpu_dram": construct(DeviceClass, read_bandwidth=20000.0, write_bandwidth=20000.0, base_latency=1.0),
    "s3": construct(DeviceClass, read_bandwidth=1000.0, write_bandwidth=1000.0, base_latency=30000.0),
}


class _DefaultsFile(StrictModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)  # defaults.yaml holds much more
    kv_offload_devices: dict[str, DeviceClass] = Field(default_factory=dict)


def load_device_classes(path: str | Path) -> dict[str, DeviceClass]:
    """The ``kv_offload_devices`` of a reference ``defaults.yaml`` (other top-level keys are ignored)."""
    return dict(validate(_DefaultsFile, load_yaml(path)).kv_offload_devices)


# --------------------------------------------------------------------------------------------- the user file


class _TierSpec(StrictModel):
    type: str | None = None
    root_dir: str | None = None
    n_read_threads: int | None = None
    n_write_threads: int | None = None
    locality: str | None = None
    enable_kv_events: bool | None = None
    direct_io: bool | None = None
    device_class: str | None = None
    read_bandwidth: float | None = None
    write_bandwidth: float | None = None
    base_latency: float | None = None
    max_bytes: int | None = None  # ours (vLLM PR #54327); BLIS rejects it as an unknown key


class _OffloadSpec(StrictModel):
    cpu_bytes_to_use: int | None = None
    block_size: int | None = None
    blocks_per_chunk: int | None = None
    tokens_per_hash: int | None = None
    eviction_policy: str | None = None
    offload_prompt_only: bool | None = None
    self_describing_kv_events: bool | None = None
    store_threshold: int | None = None
    secondary_tiers: list[_TierSpec] | None = None


class _OffloadFile(StrictModel):
    kv_offload: _OffloadSpec | None = None


def load_offload_config(path: str | Path, *, kv_bytes_per_token: float, gpu_block_size: int = DEFAULT_GPU_BLOCK_SIZE,
                        device_classes: Mapping[str, DeviceClass] | None = None) -> OffloadConfig:
    """Read, resolve and validate an offload config file (``kv_bytes_per_token`` is per TP rank)."""
    return _resolve_doc(load_yaml(path), kv_bytes_per_token, gpu_block_size, device_classes)


def parse_offload_config(text: str, *, kv_bytes_per_token: float, file: str = "<string>",
                         gpu_block_size: int = DEFAULT_GPU_BLOCK_SIZE,
                         device_classes: Mapping[str, DeviceClass] | None = None) -> OffloadConfig:
    """Same as :func:`load_offload_config` for YAML text."""
    return _resolve_doc(parse_yaml(text, file), kv_bytes_per_token, gpu_block_size, device_classes)


def _resolve_doc(doc: YamlDoc, kv_bytes_per_token: float, gpu_block_size: int,
                 device_classes: Mapping[str, DeviceClass] | None) -> OffloadConfig:
    if doc.data is None or (isinstance(doc.data, dict) and doc.data.get("kv_offload") is None):
        if isinstance(doc.data, dict) and set(doc.data) - {"kv_offload"}:
            validate(_OffloadFile, doc, plain_strings=True)  # reports the unknown top-level key
        raise ConfigError("kv_offload: the --kv-offload-config file has no top-level kv_offload: block",
                          file=doc.file, line=doc.line_of(("kv_offload",)) if isinstance(doc.data, dict) else None)
    spec = validate(_OffloadFile, doc, plain_strings=True).kv_offload
    assert spec is not None
    return _resolve(spec, kv_bytes_per_token, gpu_block_size, device_classes, _Where(doc.file, doc, "kv_offload"))


def _resolve(spec: _OffloadSpec, kv_bytes_per_token: float, gpu_bs: int,
             device_classes: Mapping[str, DeviceClass] | None, where: _Where) -> OffloadConfig:
    classes = DEFAULT_DEVICE_CLASSES if device_classes is None else device_classes
    if spec.cpu_bytes_to_use is None:
        where.fail("cpu_bytes_to_use", "kv_offload: cpu_bytes_to_use is required")
    st = spec.store_threshold
    if st is not None and st < 0:
        where.fail("store_threshold", f"kv_offload: store_threshold must be >= 0, got {st}")
    if st is not None and st >= 2 and spec.secondary_tiers:
        where.fail("store_threshold",
                   f"kv_offload: store_threshold={st}: store_threshold is not supported for TieringOffloadingSpec "
                   "(values >= 2 are rejected; it is single-tier-only and fixed at 1 on the multi-tier offload "
                   "path)")
    if gpu_bs <= 0:
        where.fail("block_size", f"kv_offload: GPU block size (--block-size-in-tokens) must be > 0, got {gpu_bs}")
    if spec.block_size is not None and spec.blocks_per_chunk is not None:
        where.fail("blocks_per_chunk",
                   "kv_offload: block_size and blocks_per_chunk are mutually exclusive (they encode the same "
                   "quantity: block_size = blocks_per_chunk × gpu_block_size); set at most one")
    if spec.block_size is not None:
        if spec.block_size <= 0 or spec.block_size % gpu_bs:
            where.fail("block_size", f"kv_offload: block_size ({spec.block_size}) must be a positive multiple of "
                                     f"the GPU block size ({gpu_bs})")
        block_size, bpc = spec.block_size, spec.block_size // gpu_bs
    elif spec.blocks_per_chunk is not None:
        bpc = spec.blocks_per_chunk
        if bpc <= 0:
            where.fail("blocks_per_chunk", f"kv_offload: blocks_per_chunk must be > 0, got {bpc}")
        if bpc > _INT64_MAX // gpu_bs:
            where.fail("blocks_per_chunk", f"kv_offload: blocks_per_chunk ({bpc}) is too large: blocks_per_chunk "
                                           f"× GPU block size ({gpu_bs}) would overflow int64")
        block_size = bpc * gpu_bs
    else:
        block_size, bpc = gpu_bs, 1
    tiers = []
    for i, t in enumerate(spec.secondary_tiers or []):
        tiers.append(_resolve_tier(i, t, classes, where))
    assert spec.cpu_bytes_to_use is not None
    return _build(cpu_bytes=spec.cpu_bytes_to_use, gpu_bs=gpu_bs, block_size=block_size, bpc=bpc,
                  tph=gpu_bs if spec.tokens_per_hash is None else spec.tokens_per_hash,
                  policy="lru" if spec.eviction_policy is None else spec.eviction_policy,
                  prompt_only=True if spec.offload_prompt_only is None else spec.offload_prompt_only,
                  self_desc=bool(spec.self_describing_kv_events), store_threshold=st or 0, tiers=tiers,
                  kv_bytes_per_token=kv_bytes_per_token, where=where)


def _resolve_tier(i: int, t: _TierSpec, classes: Mapping[str, DeviceClass], where: _Where) -> dict[str, Any]:
    f = f"secondary_tiers.{i}"
    if t.type is None or t.type == "":
        where.fail(f + ".type", f"kv_offload: secondary_tiers[{i}].type is required")
    if t.type != "fs":
        where.fail(f + ".type", f"kv_offload: secondary_tiers[{i}].type={t.type!r} is not supported yet (only "
                                "\"fs\" is representable; obj/p2p/example tiers have no faithful config mapping)")
    if not t.root_dir:
        where.fail(f + ".root_dir", f"kv_offload: secondary_tiers[{i}].root_dir is required for an \"fs\" tier")
    if t.direct_io is None:
        where.fail(f + ".direct_io",
                   f"kv_offload: secondary_tiers[{i}].direct_io must be set explicitly (vLLM probes O_DIRECT at run "
                   "time; like the reference, we make it an explicit config axis: direct vs buffered I/O are "
                   "materially different storage physics)")
    assert t.direct_io is not None
    device: dict[str, Any] = {"saturation_queue_depth": 1, "single_transfer_fraction": 1.0,
                              "latency_jitter_stddev": 0.0}
    if t.device_class:
        if t.device_class not in classes:
            known = ", ".join(sorted(classes)) or "<none configured>"
            where.fail(f + ".device_class", f"kv_offload: secondary_tiers[{i}].device_class={t.device_class!r} is "
                                            f"not defined in defaults.yaml kv_offload_devices (known: {known})")
        device = classes[t.device_class].regime(t.direct_io)
    elif None in (t.read_bandwidth, t.write_bandwidth, t.base_latency):
        where.fail(f, f"kv_offload: secondary_tiers[{i}] needs a device_class OR an explicit read_bandwidth + "
                      "write_bandwidth + base_latency triple")
    for name in ("read_bandwidth", "write_bandwidth", "base_latency"):
        if getattr(t, name) is not None:
            device[name] = float(getattr(t, name))
    return {"type": "fs", "root_dir": t.root_dir, "direct_io": t.direct_io,
            "n_read_threads": DEFAULT_THREADS if t.n_read_threads is None else t.n_read_threads,
            "n_write_threads": DEFAULT_THREADS if t.n_write_threads is None else t.n_write_threads,
            "locality": t.locality or "", "enable_kv_events": bool(t.enable_kv_events),
            "device_class": t.device_class or "", "max_bytes": t.max_bytes,
            **{k: float(v) if k != "saturation_queue_depth" else int(v) for k, v in device.items()}}


def resolve_offload_config(data: Mapping[str, Any], *, kv_bytes_per_token: float, file: str = "<config>",
                           gpu_block_size: int = DEFAULT_GPU_BLOCK_SIZE,
                           device_classes: Mapping[str, DeviceClass] | None = None) -> OffloadConfig:
    """Resolve an already-parsed ``{"kv_offload": {...}}`` mapping (no line numbers in errors)."""
    doc = YamlDoc(data=dict(data), file=file)
    return _resolve_doc(doc, kv_bytes_per_token, gpu_block_size, device_classes)
