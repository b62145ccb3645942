"""A cluster in a scenario (docs/cluster.md §6): the server block's replicas and routing, the emulator's
``--replicas``, and a cell's verdicts per replica."""
from __future__ import annotations

import json
import time
import urllib.request

import pytest

from blis_sim.emulator import EmulatorConfig, spawn_emulator
from blis_sim.errors import FormatError
from pytest_blis._scenario import load_scenario_text

CELL = """
scenarios:
  c:
    server: {{replicas: 2, routing_policy: {policy}{extra}}}
    phases: [{{seed: {{groups: 2, prefix_length: 64}}}}]
"""


def test_the_server_block_declares_a_cluster_and_its_routing() -> None:
    [point] = load_scenario_text(CELL.format(policy="weighted", extra=", routing_scorers: 'prefix-affinity:2'"))
    server = point.spec.server
    assert server.replicas == 2 and server.routing().scorers == (("prefix-affinity", 2.0),)
    for policy, extra, words in (("recorded", "", "replay's"), ("random", "", "expected one of"),
                                 ("weighted", "", "needs routing_scorers"),
                                 ("round-robin", ", simulator_sweep: {total_kv_blocks: [64]}", "one server")):
        text = CELL.format(policy=policy, extra="") if "sweep" not in extra else \
            CELL.format(policy=policy, extra="") + "    simulator_sweep: {total_kv_blocks: [64]}\n"
        with pytest.raises(FormatError, match=words):
            load_scenario_text(text)


def _hits(url: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_queries_total"))


def test_the_emulator_serves_independent_replicas() -> None:
    with spawn_emulator(EmulatorConfig(num_gpu_blocks=64), replicas=2) as proc:
        assert len(proc.urls) == 2 and len(set(proc.urls)) == 2
        body = json.dumps({"model": "tiny-llama", "prompt": "a b c d e f g h", "max_tokens": 2}).encode()
        req = urllib.request.Request(proc.urls[0] + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()
        deadline = time.monotonic() + 10
        while _hits(proc.urls[0]) == 0 and time.monotonic() < deadline:  # counters land at the stats interval
            time.sleep(0.1)
        assert _hits(proc.urls[0]) > 0 and _hits(proc.urls[1]) == 0  # one engine, one cache each
