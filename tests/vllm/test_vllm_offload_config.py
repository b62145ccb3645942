"""Our reading of vLLM's offload configuration checked against vLLM 0.32's own code, run in the lane's
interpreter (no server): what ``--kv-offloading-size`` becomes, which kv_transfer_configs vLLM accepts or
refuses, and the keyword arguments of its fs tier."""
from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest
from vllm_lane import lane, unavailable

from blis_sim.errors import InputError
from blis_sim.formats.offload import load_offload_config
from blis_sim.formats.offload_vllm import _FS_KEYS, from_flags

SIZES = (0.5, 1.0, 0.1, 2.25)
ACCEPTED = [
    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30}},
    {"kv_connector": "OffloadingConnector", "kv_role": "kv_producer", "kv_port": 1, "engine_id": "e",
     "kv_load_failure_policy": "recompute",
     "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 1 << 30,
                                   "block_size": 64, "eviction_policy": "arc",
                                   "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/kv"}]}},
]
REFUSED = [  # vLLM's KVTransferConfig or OffloadingSpecFactory refuses each
    {"kv_conector": "OffloadingConnector", "kv_role": "kv_both"},
    {"kv_connector": "OffloadingConnector"},
    {"kv_connector": "OffloadingConnector", "kv_role": "kv_everything"},
    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config":
        {"spec_name": "NvmeSpec", "cpu_bytes_to_use": 1 << 30}},
]

PROBE = textwrap.dedent("""
    import inspect, json, sys
    from types import SimpleNamespace
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.config.vllm import VllmConfig
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

    cases = json.loads(sys.argv[1])
    out = {"flags": [], "accepted": [], "fs_params": list(inspect.signature(FileSystemTierManager).parameters)}
    for size in cases["sizes"]:
        ns = SimpleNamespace(cache_config=SimpleNamespace(kv_offloading_size=size, kv_offloading_backend="native"),
                             kv_transfer_config=None)
        VllmConfig._post_init_kv_transfer_config(ns)  # what vllm serve --kv-offloading-size does
        k = ns.kv_transfer_config
        out["flags"].append({"kv_connector": k.kv_connector, "kv_role": k.kv_role,
                             "kv_connector_extra_config": k.kv_connector_extra_config})
    for data in cases["configs"]:
        try:
            k = KVTransferConfig(**data)
            OffloadingSpecFactory.get_spec_cls(k.kv_connector_extra_config)
            out["accepted"].append(True)
        except Exception:
            out["accepted"].append(False)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def vllm_answers() -> dict:
    if os.environ.get("BLIS_SKIP_VLLM") == "1":
        pytest.skip("BLIS_SKIP_VLLM=1: the real-vLLM lane runs in its own step")
    paths = lane.cache_paths()
    if not lane.installed(paths):
        unavailable(f"no vLLM lane in {paths.venv}: run `python tools/vllm_cpu.py install`")
    cases = {"sizes": list(SIZES), "configs": ACCEPTED + REFUSED}
    out = subprocess.run([str(paths.python), "-c", PROBE, json.dumps(cases)], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_kv_offloading_size_becomes_what_vllm_makes_of_it(vllm_answers: dict) -> None:
    assert vllm_answers["flags"] == [from_flags(size) for size in SIZES]
    for size in SIZES:
        cfg = load_offload_config(None, kv_bytes_per_token=4096, kv_offloading_size=size)
        assert cfg.cpu_bytes_to_use == int(size * (1 << 30))


def test_we_accept_what_vllm_accepts_and_refuse_what_it_refuses(vllm_answers: dict) -> None:
    assert vllm_answers["accepted"] == [True] * len(ACCEPTED) + [False] * len(REFUSED)
    for data in ACCEPTED:
        load_offload_config(json.dumps(data), kv_bytes_per_token=4096, warn=lambda message: None)
    for data in REFUSED:
        with pytest.raises(InputError):
            load_offload_config(json.dumps(data), kv_bytes_per_token=4096, warn=lambda message: None)


def test_the_fs_tier_takes_the_keys_we_accept(vllm_answers: dict) -> None:
    # SecondaryTierFactory pops type, module_path and backpressure; the rest are FileSystemTierManager's kwargs
    passed = {"offloading_spec", "primary_kv_view", "tier_type", "backpressure_detector"}
    assert set(vllm_answers["fs_params"]) - passed == set(_FS_KEYS) - {"type", "module_path", "backpressure"}
