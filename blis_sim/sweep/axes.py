"""Sweep axes: which simulator settings a sweep (or a capacity search) may vary, how a value is
read, and how one point's values turn the base settings into that point's settings.

Axis names (``docs/sweep.md`` has the table):

* engine: ``total_kv_blocks``, ``max_num_seqs``, ``max_num_batched_tokens``,
  ``long_prefill_token_threshold``, ``seed``;
* ``latency_coefficients``: a linear coefficient file (relative to the sweep file);
* offload: ``kv_offload.cpu_bytes_to_use``, ``.eviction_policy``, ``.store_threshold``,
  ``.offload_prompt_only``, ``.blocks_per_chunk``, and per secondary tier
  ``kv_offload.secondary_tiers.<i>.max_bytes`` / ``read_bandwidth`` / ``write_bandwidth`` /
  ``base_latency`` / ``n_read_threads`` / ``n_write_threads`` / ``device_class``;
* a trace base: ``rate_scale`` (arrivals compressed by this factor: 2 = twice the request rate);
* a workload-spec base: ``num_requests`` and ``workload.<path>`` (any spec field, ``*`` for every
  item of a list: ``workload.aggregate_rate``, ``workload.clients.*.prefix_length``).

Byte sizes take an integer or a string with a unit (``"512MiB"``, ``"2GiB"``, ``"1.5GB"``).
A value that cannot apply raises :class:`ValueError` with the reason; the caller adds the sweep
file's line.
"""
from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from blis_sim.engine.settings import with_flags
from blis_sim.errors import InputError
from blis_sim.formats.offload import DEFAULT_DEVICE_CLASSES, OffloadConfig, TierConfig

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: Any) -> int:
    """Bytes from an integer or a string such as ``"2GiB"`` / ``"1.5 GB"`` / ``"4096"``."""
    if isinstance(value, bool):
        raise ValueError(f"a byte size is an integer or a string like '2GiB', got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"a byte size must be ≥ 1, got {value}")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 1:
        return int(value)
    m = _SIZE_RE.match(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"{value!r} is not a byte size (an integer, or e.g. '512MiB', '2GiB')")
    n = float(m.group(1)) * _UNITS[(m.group(2) or "B").lower()]
    if n < 1:
        raise ValueError(f"a byte size must be ≥ 1 byte, got {value!r}")
    return int(n)


def _int(lo: int) -> Callable[[Any], int]:
    def read(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        if value < lo:
            raise ValueError(f"must be ≥ {lo}, got {value}")
        return value
    return read


def positive_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a finite number > 0, got {value!r}")
    return float(value)


def _nonneg_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"must be a finite number ≥ 0, got {value!r}")
    return float(value)


def _choice(*allowed: str) -> Callable[[Any], str]:
    def read(value: Any) -> str:
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}, got {value!r}")
        return str(value)
    return read


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _any(value: Any) -> Any:
    return value


# engine axis -> (EngineOptions field, reader)
ENGINE_AXES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "total_kv_blocks": ("num_gpu_blocks", _int(2)),
    "max_num_seqs": ("max_num_seqs", _int(1)),
    "max_num_batched_tokens": ("max_num_batched_tokens", _int(1)),
    "long_prefill_token_threshold": ("long_prefill_token_threshold", _int(0)),
    "seed": ("seed", _int(0)),
}
OFFLOAD_AXES: dict[str, Callable[[Any], Any]] = {
    "cpu_bytes_to_use": parse_size, "eviction_policy": _choice("lru", "arc"),
    "store_threshold": _int(0), "offload_prompt_only": _bool, "blocks_per_chunk": _int(1),
}
TIER_AXES: dict[str, Callable[[Any], Any]] = {
    "max_bytes": parse_size, "read_bandwidth": positive_float, "write_bandwidth": positive_float,
    "base_latency": _nonneg_float, "n_read_threads": _int(1), "n_write_threads": _int(1),
    "device_class": _string,
}
# cluster axis -> reader (docs/cluster.md §4: replicas and their routing, the flags of `blis replay` / `run`)
CLUSTER_AXES: dict[str, Callable[[Any], Any]] = {
    "num_instances": _int(1), "routing_policy": _string, "routing_scorers": _string,
}
_TIER_RE = re.compile(r"^kv_offload\.secondary_tiers\.(\d+)\.([a-z_]+)$")
SIZE_AXES = ("kv_offload.cpu_bytes_to_use",)


@dataclass(frozen=True)
class AxisKind:
    """What an axis name refers to. ``target``: engine | latency | offload | tier | rate | workload
    | num_requests | cluster."""

    name: str
    target: str
    read: Callable[[Any], Any]
    field: str = ""          # the EngineOptions / offload / tier field, or the workload path
    tier: int = -1

    @property
    def needs_offload(self) -> bool:
        return self.target in ("offload", "tier")

    @property
    def numeric(self) -> bool:
        """Whether values may be numbers (a capacity search needs a numeric axis)."""
        return self.target != "latency" and self.field not in (
            "eviction_policy", "offload_prompt_only", "device_class", "routing_policy", "routing_scorers")

    @property
    def integer(self) -> bool:
        """Whether values are integers (a capacity search then rounds its probes)."""
        return self.read in (parse_size,) or self.target in ("engine", "num_requests") or (
            self.field == "num_instances") or (
            self.target in ("offload", "tier") and self.field in (
                "cpu_bytes_to_use", "store_threshold", "blocks_per_chunk", "max_bytes",
                "n_read_threads", "n_write_threads"))


def axis_kind(name: str, *, base_kind: str) -> AxisKind:
    """The axis ``name`` means, for a base of kind ``trace`` or ``spec``; ValueError if none."""
    if name in ENGINE_AXES:
        field, read = ENGINE_AXES[name]
        return AxisKind(name, "engine", read, field)
    if name == "latency_coefficients":
        return AxisKind(name, "latency", _string)
    if name in CLUSTER_AXES:
        return AxisKind(name, "cluster", CLUSTER_AXES[name], name)
    if name.startswith("kv_offload."):
        field = name[len("kv_offload."):]
        if field in OFFLOAD_AXES:
            return AxisKind(name, "offload", OFFLOAD_AXES[field], field)
        m = _TIER_RE.match(name)
        if m and m.group(2) in TIER_AXES:
            return AxisKind(name, "tier", TIER_AXES[m.group(2)], m.group(2), int(m.group(1)))
        raise ValueError(f"unknown offload axis '{name}': kv_offload.<{'|'.join(OFFLOAD_AXES)}> or "
                         f"kv_offload.secondary_tiers.<i>.<{'|'.join(TIER_AXES)}>")
    if name == "rate_scale":
        if base_kind != "trace":
            raise ValueError("'rate_scale' scales a trace's arrivals; for a workload spec sweep "
                             "'workload.aggregate_rate'")
        return AxisKind(name, "rate", positive_float)
    if name == "num_requests" or name.startswith("workload."):
        if base_kind != "spec":
            raise ValueError(f"axis '{name}' changes the workload spec: it needs a --workload-spec base")
        if name == "num_requests":
            return AxisKind(name, "num_requests", _int(1))
        path = name[len("workload."):]
        if not path or any(not p for p in path.split(".")):
            raise ValueError(f"axis '{name}' names no spec field")
        return AxisKind(name, "workload", _any, path)
    known = [*ENGINE_AXES, "latency_coefficients", *CLUSTER_AXES, "kv_offload.<field>",
             "kv_offload.secondary_tiers.<i>.<field>", "rate_scale (trace)",
             "num_requests (spec)", "workload.<path> (spec)"]
    raise ValueError(f"unknown axis '{name}' (axes: {', '.join(known)})")


# --------------------------------------------------------------------------------------------


def override_offload(cfg: Any, changes: Mapping[tuple[int, str], Any],
                     device_classes: Mapping[str, Any] | None = None) -> Any:
    """``cfg`` (a resolved OffloadConfig) with ``changes``: ``(-1, field)`` for a top-level field,
    ``(i, field)`` for secondary tier ``i``; validated as a resolved config is."""
    top = cfg.model_dump()
    tiers = [t.model_dump() for t in cfg.secondary_tiers]
    for (tier, field), value in changes.items():
        if tier < 0:
            top[field] = value
            continue
        if tier >= len(tiers):
            raise ValueError(f"the base offload config has {len(tiers)} secondary tier(s), no tier {tier}")
        t = tiers[tier]
        if field == "device_class":
            classes = DEFAULT_DEVICE_CLASSES if device_classes is None else device_classes
            if value not in classes:
                raise ValueError(f"device_class {value!r} is not defined (known: {', '.join(sorted(classes))})")
            t.update(classes[value].regime(t["direct_io"]), device_class=value)
        else:
            t[field] = value
    if top["store_threshold"] == 1:  # 0 and 1 both mean "off" (vLLM)
        top["store_threshold"] = 0
    top["block_size"] = top["blocks_per_chunk"] * top["gpu_block_size"]
    top["bytes_per_chunk"] = int(top["kv_bytes_per_token"] * top["block_size"])
    for i, t in enumerate(tiers):
        if t["max_bytes"] is not None and t["max_bytes"] < top["bytes_per_chunk"]:
            raise ValueError(f"secondary_tiers[{i}].max_bytes ({t['max_bytes']}) is smaller than one "
                             f"offload chunk ({top['bytes_per_chunk']} bytes)")
    try:
        top["secondary_tiers"] = tuple(TierConfig(**t) for t in tiers)
        return OffloadConfig(**top)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        raise ValueError(str(err["msg"]).removeprefix("Value error, ")) from None


def set_path(data: Any, path: str, value: Any) -> Any:
    """A deep copy of ``data`` with the dotted ``path`` set to ``value`` (``*`` = every list item;
    a missing final key is added). ValueError when the path does not exist."""
    out = copy.deepcopy(data)
    parts = path.split(".")

    def walk(node: Any, i: int, where: str) -> None:
        key = parts[i]
        last = i == len(parts) - 1
        if key == "*":
            if not isinstance(node, list) or not node:
                raise ValueError(f"'{where}' is not a non-empty list")
            for k in range(len(node)):
                if last:
                    node[k] = copy.deepcopy(value)
                else:
                    walk(node[k], i + 1, f"{where}.{k}")
            return
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ValueError(f"'{where}' has no item {key}")
            idx: Any = int(key)
        elif isinstance(node, dict):
            if not last and key not in node:
                raise ValueError(f"the spec has no '{(where + '.' if where else '') + key}'")
            idx = key
        else:
            raise ValueError(f"'{where}' is not a mapping or a list")
        if last:
            node[idx] = copy.deepcopy(value)
        else:
            walk(node[idx], i + 1, f"{where}.{key}" if where else key)

    walk(out, 0, "")
    return out


class SettingError(ValueError):
    """A value that cannot apply; ``axis`` names it."""

    def __init__(self, axis: str, reason: str) -> None:
        super().__init__(reason)
        self.axis = axis


def apply_settings(options: Any, settings: Mapping[str, Any], kinds: Mapping[str, AxisKind], *,
                   load_latency: Callable[[str], Any],
                   device_classes: Mapping[str, Any] | None = None) -> Any:
    """``options`` (EngineOptions) with the simulator settings of one point: engine fields, a
    latency coefficient file (``load_latency(path) -> StepModel``), offload fields (applied to the
    options' resolved offload config). Settings of other targets are left to the caller.
    :class:`SettingError` names the axis of a value that cannot apply."""
    engine: dict[str, Any] = {}
    offload: dict[tuple[int, str], Any] = {}
    for name, value in settings.items():
        kind = kinds[name]
        if kind.target == "engine":
            engine[kind.field] = value
        elif kind.target == "latency":
            try:
                engine.update(latency=load_latency(value), latency_source=str(value))
            except (InputError, OSError) as exc:  # names the file (and line and field)
                raise SettingError(name, str(exc)) from None
        elif kind.target in ("offload", "tier"):
            offload[(kind.tier, kind.field)] = value
    options = with_flags(options, **engine) if engine else options  # a point's axes are its flags
    if offload:
        first = next(n for n in settings if kinds[n].target in ("offload", "tier"))
        if options.kv_offload is None:
            raise SettingError(first, "kv_offload axes need a base offload config (--kv-offload-config, "
                                      "or the trace header's kv_offload block)")
        try:
            options = with_flags(options, kv_offload=override_offload(options.kv_offload, offload, device_classes))
        except ValueError as exc:
            raise SettingError(first, str(exc)) from None
    return options
