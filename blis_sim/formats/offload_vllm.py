"""What a deployment passes to ``vllm serve`` for KV offloading, read as our offload config.

Three forms, all resolved by :func:`blis_sim.formats.offload.load_offload_config` into the same
:class:`~blis_sim.formats.offload.OffloadConfig` as the equivalent ``kv_offload:`` YAML:

- the ``--kv-transfer-config`` JSON (vLLM 0.32's ``KVTransferConfig``), as a file, as an inline JSON
  string, or as a YAML file holding the same structure::

      {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
       "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 33554432,
                                     "block_size": 64, "eviction_policy": "lru",
                                     "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/kv"}]}}

- ``--kv-offloading-size GIB`` (and ``--kv-offloading-backend native``): vLLM's shorthand. As in
  ``VllmConfig._post_init_kv_transfer_config`` (vllm/config/vllm.py) it sets the connector to
  ``OffloadingConnector``, the role to ``kv_both`` and ``cpu_bytes_to_use`` to ``GIB × 2**30``, over
  whatever kv_transfer_config is given too; the size is the total over all TP ranks. ``lmcache`` is refused.

The rules are vLLM 0.32's, each from the file that applies it:

- ``KVTransferConfig`` (vllm/config/kv_transfer.py) forbids unknown fields; ``kv_role`` is required once
  ``kv_connector`` is set. Only ``OffloadingConnector`` is modelled.
- ``OffloadingSpecFactory.get_spec_cls`` (vllm/v1/kv_offload/factory.py): ``spec_name`` defaults to
  ``CPUOffloadingSpec``; a name that is not registered needs ``spec_module_path``. Such an out-of-tree spec
  is read as the stock spec it is assumed to subclass: ``TieringOffloadingSpec`` when it has
  ``secondary_tiers``, else ``CPUOffloadingSpec`` (with a warning).
- ``CPUOffloadingSpec`` (vllm/v1/kv_offload/cpu/spec.py): ``cpu_bytes_to_use`` required and non-zero
  (``int()`` of it is used), ``eviction_policy`` (``lru``), ``store_threshold`` (< 2 = off),
  ``max_tracker_size`` (64000). It ignores ``secondary_tiers`` (a warning says so).
- ``OffloadingSpec`` (vllm/v1/kv_offload/base.py): ``offload_prompt_only`` (true),
  ``self_describing_kv_events`` (false).
- ``build_offloading_config`` (vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py):
  ``block_size`` (tokens per offload chunk, a multiple of the GPU block) or ``blocks_per_chunk``, not both.
- ``TieringOffloadingSpec`` (vllm/v1/kv_offload/tiering/spec.py): ``secondary_tiers`` a list; no
  ``store_threshold >= 2``. ``SecondaryTierFactory`` (tiering/factory.py): each tier has a ``type``;
  ``FileSystemTierManager`` (tiering/fs/manager.py) takes ``root_dir`` (required), ``n_read_threads`` /
  ``n_write_threads`` (16), ``enable_kv_events``, ``locality`` (``LOCAL`` | ``REMOTE``) and nothing else.

What vLLM reads and we cannot model is refused (another connector, an ``lmcache`` backend, a tier other
than ``fs``, a custom eviction policy, ``backpressure``, a ``max_tracker_size`` other than 64000); the
layout-only ``canonical_layout`` is accepted and has no effect. A key vLLM would silently ignore is an
error here (a typo would otherwise change the deployment without a word), except in the extra config of an
out-of-tree spec, whose own keys we cannot know (a warning names them).

vLLM's fs tier has no timing fields: every tier gets ``direct_io: true`` (vLLM uses O_DIRECT when its probe
of ``root_dir`` succeeds) and ``device_class: nvme_gen4`` (:data:`TIMING_DEFAULTS`), and one warning names
them. A native ``kv_offload:`` YAML sets them.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from blis_sim.formats._strict import YamlDoc

#: The root the translated block keeps: errors then name the vLLM file's own paths and lines.
EXTRA = "kv_connector_extra_config"

#: What a secondary tier of vLLM's form gets for the fields only timing needs.
TIMING_DEFAULTS: dict[str, Any] = {"direct_io": True, "device_class": "nvme_gen4"}

GIB = 1 << 30
BACKENDS = ("native", "lmcache")
_TOP_KEYS = ("kv_connector", "engine_id", "kv_buffer_device", "kv_role", "kv_port", EXTRA,
             "kv_connector_module_path", "enable_permute_local_kv", "kv_load_failure_policy")
_ROLES = ("kv_producer", "kv_both", "kv_consumer")  # vLLM's order (get_args(KVRole))
_STOCK_SPECS = {"CPUOffloadingSpec": "cpu", "TieringOffloadingSpec": "tiering"}
_CPU_KEYS = ("spec_name", "spec_module_path", "cpu_bytes_to_use", "block_size", "blocks_per_chunk",
             "eviction_policy", "cache_policy_module_path", "store_threshold", "max_tracker_size",
             "offload_prompt_only", "self_describing_kv_events", "canonical_layout")
_TIERING_KEYS = _CPU_KEYS + ("secondary_tiers", "backpressure")
_FS_KEYS = ("type", "module_path", "root_dir", "n_read_threads", "n_write_threads", "enable_kv_events", "locality",
            "backpressure")
_VLLM_TIERS = ("example", "fs", "p2p", "obj", "kvcr")
_MAX_TRACKER_SIZE = 64_000

Add = Callable[[str, str], None]


def is_vllm_form(data: Any) -> bool:
    """True for a mapping shaped as vLLM's ``KVTransferConfig`` (and not our ``kv_offload:`` block)."""
    return isinstance(data, dict) and "kv_offload" not in data and any(k in data for k in _TOP_KEYS)


def from_flags(size_gib: float, backend: str | None = None) -> dict[str, Any]:
    """The ``KVTransferConfig`` that ``--kv-offloading-size`` alone gives (before :func:`translate`)."""
    return apply_flags({}, size_gib, backend, lambda field, msg: None)


def apply_flags(data: dict[str, Any], size_gib: float | None, backend: str | None, add: Add) -> dict[str, Any]:
    """``--kv-offloading-size`` / ``--kv-offloading-backend`` applied over ``data`` as vLLM does."""
    if backend is not None and backend not in BACKENDS:
        add("", f"--kv-offloading-backend {backend!r}: vLLM's choices are {', '.join(BACKENDS)}")
        return data
    if size_gib is None:
        return data  # vLLM activates the backend only with a size
    if not (isinstance(size_gib, (int, float)) and math.isfinite(size_gib)):
        add("", f"--kv-offloading-size must be a finite number of GiB, got {size_gib!r}")
        return data
    if (backend or "native") == "lmcache":
        add("", "--kv-offloading-backend lmcache is not modelled: vLLM then uses LMCacheMPConnector, whose "
                "storage lives in a separate LMCache server process (only the native OffloadingConnector is)")
        return data
    extra = data.get(EXTRA, {})
    if isinstance(extra, dict):  # anything else is refused by translate()
        extra = {**extra, "cpu_bytes_to_use": size_gib * GIB}
    return {**data, "kv_connector": "OffloadingConnector", "kv_role": "kv_both", EXTRA: extra}


def translate(doc: YamlDoc, *, gpu_block_size: int, add: Add, note: Callable[[str], None]) -> YamlDoc:
    """vLLM's form -> ``{kv_connector_extra_config: <our kv_offload block>}`` with ``doc``'s lines.

    ``add(field, message)`` records a problem (dotted path from the document's root), ``note(text)`` a
    defaulted or ignored setting for the one warning. The block's values are checked afterwards by the
    native resolver, whose messages then carry this document's file, line and vLLM field path.
    """
    data = doc.data
    for key in data:
        if key not in _TOP_KEYS:
            add(str(key), f"unknown key {key!r}: vLLM's KVTransferConfig has no such field and refuses it "
                          f"(its fields: {', '.join(_TOP_KEYS)})")
    connector, role = data.get("kv_connector"), data.get("kv_role")
    if connector is None:
        add("kv_connector", "kv_connector is not set: this kv_transfer_config enables no KV connector, so there is "
                            "no offloading to model (set \"kv_connector\": \"OffloadingConnector\")")
    elif connector != "OffloadingConnector":
        add("kv_connector", f"kv_connector {connector!r} is not modelled: only vLLM's OffloadingConnector (its CPU "
                            "tier, and TieringOffloadingSpec's fs tiers) is")
    if role is None and connector is not None:
        add("kv_role", f"Please specify kv_role when kv_connector is set, supported roles are {_ROLES} (vLLM's "
                       "KVTransferConfig)")
    elif role is not None and role not in _ROLES:
        add("kv_role", f"Unsupported kv_role: {role!r}. Supported roles are {_ROLES}")
    policy = data.get("kv_load_failure_policy")
    if policy is not None and policy not in ("recompute", "fail"):
        add("kv_load_failure_policy", f"kv_load_failure_policy must be 'recompute' or 'fail', got {policy!r}")
    extra = data.get(EXTRA, {})
    if not isinstance(extra, dict):  # KVTransferConfig's field is a dict: null is refused too
        add(EXTRA, f"{EXTRA} must be a mapping, got {type(extra).__name__}")
        extra = {}
    block = _extra(extra, gpu_block_size, lambda f, m: add(f"{EXTRA}.{f}".rstrip("."), m), note)
    return YamlDoc(data={EXTRA: block}, file=doc.file, lines=doc.lines, raw=doc.raw)


def _extra(extra: dict[str, Any], gpu_bs: int, add: Add, note: Callable[[str], None]) -> dict[str, Any]:
    spec_name = extra.get("spec_name", "CPUOffloadingSpec")
    kind = _STOCK_SPECS.get(spec_name) if isinstance(spec_name, str) else None
    custom = False
    if kind is None:
        if extra.get("spec_module_path") is None:
            add("spec_name", f"Unsupported spec type: {spec_name} (vLLM's OffloadingSpecFactory knows "
                             f"{', '.join(_STOCK_SPECS)}; an out-of-tree spec also needs spec_module_path)")
            kind = "cpu"
        else:
            custom = True
            kind = "tiering" if "secondary_tiers" in extra else "cpu"
            stock = "TieringOffloadingSpec" if kind == "tiering" else "CPUOffloadingSpec"
            note(f"the out-of-tree spec {spec_name} (from {extra['spec_module_path']}) is read as vLLM's {stock}, "
                 "which it is assumed to subclass")
    known = _TIERING_KEYS if kind == "tiering" else _CPU_KEYS
    for key in extra:
        if key in known:
            continue
        if key == "secondary_tiers":
            note(f"{EXTRA}.secondary_tiers is ignored: vLLM's CPUOffloadingSpec reads no secondary tiers (set "
                 "spec_name: TieringOffloadingSpec for them)")
        elif custom:
            note(f"{EXTRA}.{key} is not a key of vLLM's stock specs and is ignored")
        else:
            add(str(key), f"unknown key {key!r} for {spec_name}: vLLM 0.32 would ignore it silently, so it is "
                          f"refused here (the spec reads: {', '.join(known)})")
    out: dict[str, Any] = {}
    cpu = extra.get("cpu_bytes_to_use")
    if not cpu:
        add("cpu_bytes_to_use", "cpu_bytes_to_use must be specified in kv_connector_extra_config (vLLM's "
                                "CPUOffloadingSpec; or give --kv-offloading-size GiB)")
    else:
        value = _int(cpu, "cpu_bytes_to_use", add)
        if value is not None:
            out["cpu_bytes_to_use"] = value
    bpc, tokens = extra.get("blocks_per_chunk"), extra.get("block_size")
    if bpc is not None and tokens is not None:
        add("blocks_per_chunk", "Specify only one of 'block_size' or 'blocks_per_chunk' in kv_connector_extra_config.")
    elif bpc is not None:
        n = _int(bpc, "blocks_per_chunk", add)
        if n is not None and n <= 0:
            add("blocks_per_chunk", "'blocks_per_chunk' must be greater than 0.")
        elif n is not None:
            out["blocks_per_chunk"] = n
    elif tokens is not None:
        n = _int(tokens, "block_size", add)
        if n is not None and gpu_bs > 0 and (n <= 0 or n % gpu_bs):
            suggestion = max(gpu_bs, -(-n // gpu_bs) * gpu_bs)
            add("block_size", f"'block_size'={n} in kv_connector_extra_config must be a multiple of the GPU KV "
                              f"cache block size ({gpu_bs} tokens). Use {suggestion} instead, or set "
                              "'blocks_per_chunk' to express the chunk size in blocks.")
        elif n is not None:
            out["block_size"] = n
    policy = extra.get("eviction_policy", "lru")
    if policy in ("lru", "arc"):
        out["eviction_policy"] = policy
    else:
        how = (" (a custom CachePolicy from cache_policy_module_path)" if extra.get("cache_policy_module_path")
               else "")
        add("eviction_policy", f"eviction_policy {policy!r}{how} is not modelled: only vLLM's built-in 'lru' and "
                               "'arc' are")
    threshold = extra.get("store_threshold")
    if threshold is not None:
        n = _int(threshold, "store_threshold", add)
        if n is not None and n >= 2 and kind == "tiering":
            # TieringOffloadingSpec.get_manager refuses it even with no secondary tier (our block would not)
            add("store_threshold", "store_threshold is not supported for TieringOffloadingSpec")
        elif n is not None and n >= 2:
            out["store_threshold"] = n
    size = extra.get("max_tracker_size")
    if size is not None:
        n = _int(size, "max_tracker_size", add)
        if n is not None and n != _MAX_TRACKER_SIZE:
            add("max_tracker_size", f"max_tracker_size={n} is not modelled: the simulator's reuse filter tracks "
                                    f"vLLM's default {_MAX_TRACKER_SIZE} chunks")
    for key in ("offload_prompt_only", "self_describing_kv_events", "canonical_layout"):
        if key in extra and not isinstance(extra[key], bool):
            add(key, f"{key} must be true or false, got {extra[key]!r} (vLLM takes bool() of it: a string "
                     "such as \"false\" would be true)")
        elif key in extra and key != "canonical_layout":
            out[key] = extra[key]
    if kind == "tiering" and "backpressure" in extra:
        add("backpressure", "backpressure is not modelled: vLLM's detector drops stores under load, which the "
                            "simulator does not simulate")
    if kind == "tiering" and "secondary_tiers" in extra:
        tiers = extra["secondary_tiers"]
        if not isinstance(tiers, list):
            add("secondary_tiers", "secondary_tiers must be a list of tier configurations")
        else:
            out["secondary_tiers"] = [_tier(i, t, add, note) for i, t in enumerate(tiers)]
    return out


def _tier(i: int, tier: Any, add: Add, note: Callable[[str], None]) -> dict[str, Any]:
    f = f"secondary_tiers.{i}"
    if not isinstance(tier, dict):
        add(f, f"secondary_tiers[{i}] must be a mapping (a tier configuration), got {type(tier).__name__}")
        return {"type": "fs", "root_dir": "-", **TIMING_DEFAULTS}
    kind = tier.get("type")
    if not kind:
        add(f + ".type", "Secondary tier configuration must include 'type'")
    elif kind != "fs":
        if kind in _VLLM_TIERS or tier.get("module_path") is not None:
            add(f + ".type", f"secondary_tiers[{i}].type={kind!r} is not modelled: only the \"fs\" tier is")
        else:
            add(f + ".type", f"Unknown secondary tier type: {kind!r}. Supported types: {list(_VLLM_TIERS)}. For an "
                             "out-of-tree tier, also set 'module_path'.")
    else:
        for key in tier:
            if key not in _FS_KEYS:
                add(f"{f}.{key}", f"secondary_tiers[{i}]: FileSystemTierManager got an unexpected keyword argument "
                                  f"{key!r} (vLLM's fs tier takes: {', '.join(_FS_KEYS[2:])}); timing fields such "
                                  "as direct_io or device_class belong in a native kv_offload: YAML")
        if "backpressure" in tier:
            add(f + ".backpressure", "backpressure is not modelled: vLLM's detector drops stores under load, which "
                                     "the simulator does not simulate")
    out = {k: v for k, v in tier.items() if k in ("type", "root_dir", "n_read_threads", "n_write_threads",
                                                   "enable_kv_events", "locality")}
    out["type"] = "fs"  # another type was refused above: the native check would say it twice
    out.update(TIMING_DEFAULTS)
    note(f"secondary_tiers[{i}]: " + ", ".join(f"{k}={_yaml(v)}" for k, v in TIMING_DEFAULTS.items()))
    return out


def _int(value: Any, field: str, add: Add) -> int | None:
    """vLLM's ``int(value)`` where it is exact: an int, an integral float, or a string of digits."""
    if isinstance(value, bool):
        pass
    elif isinstance(value, int):
        return value
    elif isinstance(value, float) and math.isfinite(value):
        return int(value)  # vLLM truncates: 0.1 GiB × 2**30 is 107374182.4 bytes
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    add(field, f"{field} must be an integer, got {value!r}")
    return None


def _yaml(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)
