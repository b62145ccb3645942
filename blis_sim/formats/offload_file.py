"""The offload config file (``--kv-offload-config``) and the device classes of a ``defaults.yaml``:
read, checked with the reference's messages and resolved into :class:`~blis_sim.formats.offload.OffloadConfig`.

The API is :mod:`blis_sim.formats.offload`'s (``load_offload_config``, ``parse_offload_config``,
``resolve_offload_config``, ``load_device_classes``, ``DeviceClass``, ``DEFAULT_DEVICE_CLASSES``; its
docstring has the rules); those names are served from there. This module holds the file's models so
that a replay whose trace header records its config (the header is authoritative) does not build them.
"""
from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from blis_sim import limits
from blis_sim.errors import ConfigError, FormatError, UsageError
from blis_sim.formats._model import StrictModel, construct
from blis_sim.formats._strict import (
    YamlDoc,
    _restore_strings,
    describe_each,
    load_yaml,
    parse_yaml,
    read_text,
    validate,
)
from blis_sim.formats.offload import (
    _INT64_MAX,
    DEFAULT_GPU_BLOCK_SIZE,
    DEFAULT_THREADS,
    OffloadConfig,
    _build,
    _check_tier,
    _Where,
)
from blis_sim.formats.trace_header import CpuLink

M = TypeVar("M", bound=BaseModel)

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


class _LinkSpec(StrictModel):
    read_bandwidth: float | None = None
    write_bandwidth: float | None = None
    base_latency: float | None = None


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
    cpu_link: _LinkSpec | None = None  # ours: the CPU <-> GPU link (bytes/µs, µs); BLIS rejects the key


class _OffloadFile(StrictModel):
    kv_offload: _OffloadSpec | None = None


class _VllmShaped(StrictModel):
    """vLLM's form after :func:`blis_sim.formats.offload_vllm.translate`: our block under vLLM's key."""

    kv_connector_extra_config: _OffloadSpec | None = None


#: The file name given to an inline JSON string and to ``--kv-offloading-size`` alone.
INLINE = "<--kv-offload-config JSON>"
FLAGS = "<--kv-offloading-size>"

log = logging.getLogger("blis_sim.formats.offload")


def is_inline(source: str | Path | None) -> bool:
    """True when ``source`` is ``--kv-offload-config``'s inline JSON, not a path."""
    return isinstance(source, str) and source.lstrip().startswith("{")


def load_offload_config(source: str | Path | None, *, kv_bytes_per_token: float,
                        gpu_block_size: int = DEFAULT_GPU_BLOCK_SIZE,
                        device_classes: Mapping[str, DeviceClass] | None = None,
                        kv_offloading_size: float | None = None, kv_offloading_backend: str | None = None,
                        warn: Callable[[str], None] | None = None) -> OffloadConfig:
    """Read, resolve and validate an offload config (``kv_bytes_per_token`` is per TP rank).

    ``source``: a file (our ``kv_offload:`` YAML, or vLLM's ``--kv-transfer-config`` as JSON or YAML), an
    inline JSON string (starts with ``{``), or None with ``kv_offloading_size`` (vLLM's
    ``--kv-offloading-size`` GiB, which also applies over a vLLM-form source). Every problem is reported at
    once (:class:`~blis_sim.errors.ConfigErrors` when there are several). ``warn`` gets the one message
    naming what was defaulted or ignored (default: a warning on the ``blis_sim.formats.offload`` logger).
    """
    if source is None:
        if kv_offloading_size is None:
            raise UsageError("an offload config needs --kv-offload-config or --kv-offloading-size")
        doc = YamlDoc(data={}, file=FLAGS)
    elif is_inline(source):
        doc = _parse_text(str(source), INLINE)
    else:
        doc = _parse_text(read_text(source), str(Path(source)))
    return _resolve_any(doc, kv_bytes_per_token, gpu_block_size, device_classes, kv_offloading_size,
                        kv_offloading_backend, warn)


def parse_offload_config(text: str, *, kv_bytes_per_token: float, file: str = "<string>",
                         gpu_block_size: int = DEFAULT_GPU_BLOCK_SIZE,
                         device_classes: Mapping[str, DeviceClass] | None = None,
                         kv_offloading_size: float | None = None, kv_offloading_backend: str | None = None,
                         warn: Callable[[str], None] | None = None) -> OffloadConfig:
    """Same as :func:`load_offload_config` for the text of a file."""
    return _resolve_any(_parse_text(text, file), kv_bytes_per_token, gpu_block_size, device_classes,
                        kv_offloading_size, kv_offloading_backend, warn)


def _parse_text(text: str, file: str) -> YamlDoc:
    """YAML, or JSON (what ``--kv-transfer-config`` takes). JSON forbids raw tabs inside strings, so a tab
    there is whitespace and a space serves as well for PyYAML, which refuses tab indentation; the lines
    then still come from the YAML parse."""
    try:
        return parse_yaml(text, file)
    except FormatError as exc:
        try:
            data = json.loads(text)
        except ValueError:
            raise exc from None  # not JSON either: the YAML parser's message, with its line
        try:
            return parse_yaml(text.replace("\t", " "), file)
        except FormatError:
            return YamlDoc(data=data, file=file)


def _resolve_any(doc: YamlDoc, kv_bytes_per_token: float, gpu_block_size: int,
                 device_classes: Mapping[str, DeviceClass] | None, size: float | None, backend: str | None,
                 warn: Callable[[str], None] | None) -> OffloadConfig:
    from blis_sim.formats import offload_vllm

    data = doc.data
    vllm = size is not None or offload_vllm.is_vllm_form(data)
    if not vllm:
        if backend is not None:
            raise UsageError("--kv-offloading-backend applies to vLLM's kv_transfer_config or with "
                             f"--kv-offloading-size, not to the kv_offload: YAML of {doc.file}")
        return _resolve_doc(doc, kv_bytes_per_token, gpu_block_size, device_classes)
    where = _Where(doc.file, doc, "")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        where.fail("", f"a kv_transfer_config must be a mapping, got {type(data).__name__}")
    if "kv_offload" in data:
        raise UsageError(f"--kv-offloading-size applies to vLLM's kv_transfer_config, not to the kv_offload: YAML "
                         f"of {doc.file}: set cpu_bytes_to_use there")

    def refuse(field: str, message: str) -> None:
        where.add(field, message)
        where.dropped.add(field)  # left out of the block: the native checks must not call it missing

    data = offload_vllm.apply_flags(data, size, backend, refuse)
    notes: list[str] = []
    shaped = offload_vllm.translate(YamlDoc(data=data, file=doc.file, lines=doc.lines, raw=doc.raw),
                                    gpu_block_size=gpu_block_size, add=refuse, note=notes.append)
    inner = _Where(doc.file, shaped, offload_vllm.EXTRA)
    inner.problems, inner.dropped = where.problems, where.dropped
    spec = _validate_collecting(_VllmShaped, shaped, inner).kv_connector_extra_config
    cfg = _resolve(spec or _OffloadSpec(), kv_bytes_per_token, gpu_block_size, device_classes, inner)
    if notes:
        defaulted = [n for n in notes if n.startswith("secondary_tiers[")]
        other = [n for n in notes if not n.startswith("secondary_tiers[")]
        parts = []
        if defaulted:
            parts.append("vLLM's fs tier carries no timing fields, so they are defaulted (set them in a native "
                         "kv_offload: YAML): " + "; ".join(defaulted))
        parts += other
        (warn or log.warning)(f"{doc.file}: kv_offload from vLLM's kv_transfer_config: " + "; ".join(parts))
    return cfg


def _validate_collecting(model: type[M], doc: YamlDoc, where: _Where) -> M:
    """``model`` validated with every schema problem recorded in ``where``: each offending value is dropped and
    validation repeated, so that the value checks still run on the rest of the file."""
    data = _restore_strings(model, doc.data, (), doc.raw) if doc.raw else doc.data
    for _ in range(64):
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            data = copy.deepcopy(data)
            for loc, err in describe_each(exc, doc):
                where.problems.append(err)
                where.dropped.add(".".join(str(p) for p in loc))
                data = _drop(data, loc)
    where.check()
    raise FormatError("too many schema errors", file=doc.file)


def _drop(data: Any, loc: tuple[str | int, ...]) -> Any:
    """``data`` without the value at ``loc`` (a list item becomes an empty mapping: indices stay)."""
    if not loc:
        return {}
    node = data
    for part in loc[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return data
    last = loc[-1]
    if isinstance(node, dict):
        node.pop(last, None)
    elif isinstance(node, list) and isinstance(last, int) and 0 <= last < len(node):
        node[last] = {}
    return data


def _resolve_doc(doc: YamlDoc, kv_bytes_per_token: float, gpu_block_size: int,
                 device_classes: Mapping[str, DeviceClass] | None) -> OffloadConfig:
    if doc.data is None or (isinstance(doc.data, dict) and doc.data.get("kv_offload") is None):
        if isinstance(doc.data, dict) and set(doc.data) - {"kv_offload"}:
            validate(_OffloadFile, doc, plain_strings=True)  # reports the unknown top-level key
        raise ConfigError("kv_offload: the --kv-offload-config file has no top-level kv_offload: block (nor is it "
                          "vLLM's kv_transfer_config: kv_connector, kv_role, kv_connector_extra_config)",
                          file=doc.file, line=doc.line_of(("kv_offload",)) if isinstance(doc.data, dict) else None)
    where = _Where(doc.file, doc, "kv_offload")
    spec = _validate_collecting(_OffloadFile, doc, where).kv_offload
    return _resolve(spec or _OffloadSpec(), kv_bytes_per_token, gpu_block_size, device_classes, where)


def _resolve_link(link: _LinkSpec | None, where: _Where) -> CpuLink | None:
    """``cpu_link``: both bandwidths finite and > 0 (bytes/µs), ``base_latency`` finite and >= 0 (µs, default 0)."""
    if link is None:
        return None
    ok = True
    for name in ("read_bandwidth", "write_bandwidth"):
        v = getattr(link, name)
        if v is None or not math.isfinite(v) or v <= 0:
            where.add(f"cpu_link.{name}", f"kv_offload: cpu_link.{name} must be a finite number > 0 (bytes/us), "
                                          f"got {v!r}")
            ok = False
    lat = 0.0 if link.base_latency is None else link.base_latency
    if not math.isfinite(lat) or lat < 0:
        where.add("cpu_link.base_latency", f"kv_offload: cpu_link.base_latency must be a finite number >= 0 (us), "
                                           f"got {lat!r}")
        ok = False
    if not ok or link.read_bandwidth is None or link.write_bandwidth is None:
        return None
    return construct(CpuLink, read_bandwidth=float(link.read_bandwidth), write_bandwidth=float(link.write_bandwidth),
                     base_latency=float(lat))


def _resolve(spec: _OffloadSpec, kv_bytes_per_token: float, gpu_bs: int,
             device_classes: Mapping[str, DeviceClass] | None, where: _Where) -> OffloadConfig:
    """The file's rules, every problem recorded; :func:`_build` then adds the value checks and raises them all."""
    classes = DEFAULT_DEVICE_CLASSES if device_classes is None else device_classes
    if spec.cpu_bytes_to_use is None:
        where.add("cpu_bytes_to_use", "kv_offload: cpu_bytes_to_use is required")
    st = spec.store_threshold
    if st is not None and st < 0:
        where.add("store_threshold", f"kv_offload: store_threshold must be >= 0, got {st}")
    if st is not None and st >= 2 and spec.secondary_tiers:
        where.add("store_threshold",
                  f"kv_offload: store_threshold={st}: store_threshold is not supported for TieringOffloadingSpec "
                  "(values >= 2 are rejected; it is single-tier-only and fixed at 1 on the multi-tier offload "
                  "path)")
    block_size, bpc = gpu_bs, 1
    if gpu_bs <= 0:
        where.add("block_size", f"kv_offload: GPU block size (--block-size-in-tokens) must be > 0, got {gpu_bs}")
    elif spec.block_size is not None and spec.blocks_per_chunk is not None:
        where.add("blocks_per_chunk",
                  "kv_offload: block_size and blocks_per_chunk are mutually exclusive (they encode the same "
                  "quantity: block_size = blocks_per_chunk × gpu_block_size); set at most one")
    elif spec.block_size is not None:
        if spec.block_size <= 0 or spec.block_size % gpu_bs:
            where.add("block_size", f"kv_offload: block_size ({spec.block_size}) must be a positive multiple of "
                                    f"the GPU block size ({gpu_bs})")
        else:
            block_size, bpc = spec.block_size, spec.block_size // gpu_bs
    elif spec.blocks_per_chunk is not None:
        if spec.blocks_per_chunk <= 0:
            where.add("blocks_per_chunk", f"kv_offload: blocks_per_chunk must be > 0, got {spec.blocks_per_chunk}")
        elif spec.blocks_per_chunk > _INT64_MAX // gpu_bs:
            where.add("blocks_per_chunk", f"kv_offload: blocks_per_chunk ({spec.blocks_per_chunk}) is too large: "
                                          f"blocks_per_chunk × GPU block size ({gpu_bs}) would overflow int64")
        else:
            bpc = spec.blocks_per_chunk
            block_size = bpc * gpu_bs
    tiers = [_resolve_tier(i, t, classes, where) for i, t in enumerate(spec.secondary_tiers or [])]
    if gpu_bs <= 0:
        for i, t in enumerate(tiers):
            _check_tier(i, t, where)
        where.check()
    # A missing budget or a refused chunk size is recorded: _build then runs on valid stand-ins (the
    # largest budget, one GPU block per chunk) so that its other checks still report, and raises them all.
    cpu_bytes = limits.MAX_BYTES if spec.cpu_bytes_to_use is None else spec.cpu_bytes_to_use
    link = _resolve_link(spec.cpu_link, where)
    return _build(cpu_link=link, cpu_bytes=cpu_bytes, gpu_bs=gpu_bs, block_size=block_size, bpc=bpc,
                  tph=gpu_bs if spec.tokens_per_hash is None else spec.tokens_per_hash,
                  policy="lru" if spec.eviction_policy is None else spec.eviction_policy,
                  prompt_only=True if spec.offload_prompt_only is None else spec.offload_prompt_only,
                  self_desc=bool(spec.self_describing_kv_events), store_threshold=st or 0, tiers=tiers,
                  kv_bytes_per_token=kv_bytes_per_token, where=where)


def _resolve_tier(i: int, t: _TierSpec, classes: Mapping[str, DeviceClass], where: _Where) -> dict[str, Any]:
    """Tier ``i`` resolved; a problem is recorded and a valid placeholder used, so the checks go on."""
    f = f"secondary_tiers.{i}"
    if t.type is None or t.type == "":
        where.add(f + ".type", f"kv_offload: secondary_tiers[{i}].type is required")
    elif t.type != "fs":
        where.add(f + ".type", f"kv_offload: secondary_tiers[{i}].type={t.type!r} is not supported yet (only "
                               "\"fs\" is representable; obj/p2p/example tiers have no faithful config mapping)")
    if not t.root_dir:
        where.add(f + ".root_dir", f"kv_offload: secondary_tiers[{i}].root_dir is required for an \"fs\" tier")
    direct_io = t.direct_io
    if direct_io is None:
        where.add(f + ".direct_io",
                  f"kv_offload: secondary_tiers[{i}].direct_io must be set explicitly (vLLM probes O_DIRECT at run "
                  "time; like the reference, we make it an explicit config axis: direct vs buffered I/O are "
                  "materially different storage physics)")
        direct_io = True
    device: dict[str, Any] = {"saturation_queue_depth": 1, "single_transfer_fraction": 1.0,
                              "latency_jitter_stddev": 0.0}
    placeholder = DEFAULT_DEVICE_CLASSES["nvme_gen4"].regime(direct_io)  # valid values, for the checks only
    if t.device_class:
        if t.device_class not in classes:
            known = ", ".join(sorted(classes)) or "<none configured>"
            where.add(f + ".device_class", f"kv_offload: secondary_tiers[{i}].device_class={t.device_class!r} is "
                                           f"not defined in defaults.yaml kv_offload_devices (known: {known})")
            device = placeholder
        else:
            device = classes[t.device_class].regime(direct_io)
    elif None in (t.read_bandwidth, t.write_bandwidth, t.base_latency):
        where.add(f, f"kv_offload: secondary_tiers[{i}] needs a device_class OR an explicit read_bandwidth + "
                     "write_bandwidth + base_latency triple")
        device = placeholder
    for name in ("read_bandwidth", "write_bandwidth", "base_latency"):
        if getattr(t, name) is not None:
            device[name] = float(getattr(t, name))
    return {"type": "fs", "root_dir": t.root_dir or "-", "direct_io": direct_io,
            "n_read_threads": DEFAULT_THREADS if t.n_read_threads is None else t.n_read_threads,
            "n_write_threads": DEFAULT_THREADS if t.n_write_threads is None else t.n_write_threads,
            "locality": t.locality or "", "enable_kv_events": bool(t.enable_kv_events),
            "device_class": t.device_class or "", "max_bytes": t.max_bytes,
            **{k: float(v) if k != "saturation_queue_depth" else int(v) for k, v in device.items()}}


def resolve_offload_config(data: Mapping[str, Any], *, kv_bytes_per_token: float, file: str = "<config>",
                           gpu_block_size: int = DEFAULT_GPU_BLOCK_SIZE,
                           device_classes: Mapping[str, DeviceClass] | None = None) -> OffloadConfig:
    """Resolve an already-parsed ``{"kv_offload": {...}}`` mapping, or vLLM's kv_transfer_config (no line
    numbers in errors)."""
    doc = YamlDoc(data=dict(data), file=file)
    return _resolve_any(doc, kv_bytes_per_token, gpu_block_size, device_classes, None, None, None)
