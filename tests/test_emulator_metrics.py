"""`/metrics` parses like a real vLLM's, per metric profile; counters publish at the stats interval."""
from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from blis_sim.emulator import EmulatorConfig, start_emulator

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
REAL = SAMPLES / "vllm-cpu" / "metrics-after.txt"
# Families of the real vLLM 0.32 that come from the HTTP instrumentator, not from vLLM.
INSTRUMENTATOR = {"http_request_duration_highr_seconds", "http_request_duration_seconds",
                  "http_request_size_bytes", "http_response_size_bytes"}


def families(text: str) -> dict[str, tuple[str, str]]:
    return {f.name: (f.type, f.documentation) for f in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): float(s.value)
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(text: str, name: str, **labels: str) -> float:
    labels = {"engine": "0", "model_name": "tiny-llama", **labels}
    return samples(text)[(name, tuple(sorted(labels.items())))]


def _offload_yaml(tmp_path: Path) -> str:
    path = tmp_path / "offload.yaml"
    path.write_text(f"kv_offload:\n  cpu_bytes_to_use: {64 * 32 * 512}\n  secondary_tiers:\n"
                    f"    - {{type: fs, root_dir: {tmp_path}, direct_io: true, device_class: nvme_gen4}}\n")
    return str(path)


def _scrape_after_requests(cfg: EmulatorConfig, prompts: list[list[int]]) -> str:
    with start_emulator(cfg) as emu, httpx.Client(base_url=emu.url, timeout=10) as c:
        for p in prompts:
            c.post("/v1/completions", json={"prompt": p, "max_tokens": 2}).raise_for_status()
        return c.get("/metrics").text


def test_same_families_types_and_help_as_the_real_vllm() -> None:
    real = families(REAL.read_text())
    ours = families(_scrape_after_requests(EmulatorConfig(stats_interval_s=0), [[1, 2, 3]]))
    vllm_real = {k for k in real if k.startswith("vllm:")}
    assert vllm_real <= set(ours), sorted(vllm_real - set(ours))
    assert set(real) - set(ours) <= INSTRUMENTATOR | {f + "_created" for f in INSTRUMENTATOR}
    assert {k: real[k] for k in vllm_real} == {k: ours[k] for k in vllm_real}


def test_exposition_lines_match_the_real_format() -> None:
    text = _scrape_after_requests(EmulatorConfig(stats_interval_s=0), [list(range(100, 200))])
    real = REAL.read_text()
    for line in ("# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
                 "# TYPE vllm:prefix_cache_queries_total counter",
                 "# TYPE vllm:prefix_cache_queries_created gauge",
                 "# TYPE vllm:time_to_first_token_seconds histogram"):
        assert line in real.splitlines() and line in text.splitlines()
    assert 'vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 100.0' in text.splitlines()
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny-llama"} 1.0' in text
    # Histogram sample order: buckets, _count, _sum (then the _created gauge).
    names = [ln.split("{")[0] for ln in text.splitlines()
             if ln.startswith("vllm:time_to_first_token_seconds") and "_created" not in ln]
    assert names[-2:] == ["vllm:time_to_first_token_seconds_count", "vllm:time_to_first_token_seconds_sum"]
    info = [s for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info" for s in f.samples]
    assert info[0].labels["block_size"] == "32" and info[0].labels["num_gpu_blocks"] == "131072"


def test_created_series_can_be_turned_off() -> None:
    text = _scrape_after_requests(EmulatorConfig(stats_interval_s=0, created_series=False), [[1, 2]])
    assert "vllm:prefix_cache_queries_total" in text
    assert "_created" not in text


def test_every_series_has_engine_and_model_name_labels() -> None:
    for f in text_string_to_metric_families(_scrape_after_requests(EmulatorConfig(stats_interval_s=0), [[1]])):
        if f.name == "vllm:cache_config_info":  # every CacheConfig field + engine, as in vLLM
            assert f.samples[0].labels["engine"] == "0" and "model_name" not in f.samples[0].labels
        elif f.name.startswith("vllm:") and not f.name.startswith("vllm:admission_rejections"):
            for s in f.samples:
                assert s.labels.get("engine") == "0" and s.labels.get("model_name") == "tiny-llama", s


TIERED = ("vllm:kv_offload_tiering_chunk_queries_total", "vllm:kv_offload_tiering_block_queries_total")


@pytest.mark.parametrize(("profile", "present", "absent"), [
    ("vllm-0.33",
     ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_hits_total",
      "vllm:prompt_tokens_cached_by_source_total", "vllm:prompt_tokens_by_source_total",
      "vllm:prompt_tokens_cached_total", "vllm:kv_cache_usage_perc", TIERED[0],
      "vllm:kv_offload_tiering_chunk_hits_total", "vllm:kv_offload_tiering_read_time_total",
      "vllm:kv_offload_tiering_write_bytes_total", "vllm:kv_offload_store_bytes_total",
      "vllm:kv_offload_cpu_cache_usage_perc", "vllm:kv_offload_tiering_active_cascade_jobs"],
     ["vllm:gpu_prefix_cache_queries_total", TIERED[1]]),
    ("vllm-pr48798",
     ["vllm:prefix_cache_queries_total", TIERED[1], "vllm:kv_offload_tiering_block_hits_total",
      "vllm:kv_offload_tiering_read_time_total", "vllm:kv_offload_tiering_write_time_total"],
     [TIERED[0], "vllm:prompt_tokens_cached_by_source_total"]),
    ("vllm-0.11",
     ["vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_cache_usage_perc"],
     ["vllm:prefix_cache_queries_total", "vllm:kv_cache_usage_perc", TIERED[0], TIERED[1],
      "vllm:prompt_tokens_cached_by_source_total"]),
    ("none",
     ["vllm:kv_cache_usage_perc", "vllm:cache_config_info", "vllm:time_to_first_token_seconds_count"],
     ["vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total", TIERED[0], TIERED[1],
      "vllm:external_prefix_cache_queries_total", "vllm:prompt_tokens_cached_total"]),
])
def test_metric_profiles(tmp_path: Path, profile: str, present: list[str], absent: list[str]) -> None:
    cfg = EmulatorConfig(profile="zero", block_size=32, kv_bytes_per_token=512, metrics_profile=profile,
                         kv_offload_config=_offload_yaml(tmp_path), stats_interval_s=0)
    ids = list(range(100, 196))
    text = _scrape_after_requests(cfg, [ids, ids])
    names = {name for name, _ in samples(text)}
    assert not [p for p in present if p not in names]
    assert not [a for a in absent if a in names]
    if profile in ("vllm-0.33", "vllm-pr48798"):
        assert value(text, "vllm:prefix_cache_queries_total") == 192
        assert value(text, "vllm:prefix_cache_hits_total") == 64
        spelled = TIERED[0] if profile == "vllm-0.33" else TIERED[1]
        # The miss's first pass asks the CPU tier about its 3 chunks (the fs tier answers RETRY, so
        # the scan does not stop), then the fs tier about chunk 0, its first miss; the repeat looks
        # up chunk 2 (beyond the GPU hit), a CPU hit.
        assert value(text, spelled, tier="0:primary") == 4
        assert value(text, spelled, tier="1:fs") == 1
    if profile == "vllm-0.11":
        assert value(text, "vllm:gpu_prefix_cache_hits_total") == 64
    if profile == "vllm-0.33":
        assert value(text, "vllm:prompt_tokens_cached_by_source_total", source="device") == 64
        assert value(text, "vllm:kv_offload_tiering_write_bytes_total", tier="1:fs") == 3 * 32 * 512
        assert value(text, "vllm:kv_offload_store_bytes_total") == 3 * 32 * 512
        assert ("vllm:kv_offload_tiering_read_bytes_total",
                (("engine", "0"), ("model_name", "tiny-llama"), ("tier", "0:primary"))) not in samples(text)


def test_tier_series_appear_only_after_a_tier_event(tmp_path: Path) -> None:
    cfg = EmulatorConfig(profile="zero", block_size=32, kv_bytes_per_token=512,
                         kv_offload_config=_offload_yaml(tmp_path), stats_interval_s=0)
    text = _scrape_after_requests(cfg, [])
    assert TIERED[0] not in text and "vllm:kv_offload_store_bytes_total" in text


def test_counters_publish_at_the_stats_interval() -> None:
    ids = list(range(100, 164))
    # An interval longer than the test: the request is done, the counters are not published yet.
    with start_emulator(EmulatorConfig(profile="zero", stats_interval_s=3600)) as emu, \
            httpx.Client(base_url=emu.url, timeout=10) as c:
        c.post("/v1/completions", json={"prompt": ids, "max_tokens": 1}).raise_for_status()
        assert value(c.get("/metrics").text, "vllm:prefix_cache_queries_total") == 0
    # The default short interval: visible shortly after.
    with start_emulator(EmulatorConfig(profile="zero")) as emu, httpx.Client(base_url=emu.url, timeout=10) as c:
        c.post("/v1/completions", json={"prompt": ids, "max_tokens": 1}).raise_for_status()
        deadline = time.monotonic() + 5
        while value(c.get("/metrics").text, "vllm:prefix_cache_queries_total") == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert value(c.get("/metrics").text, "vllm:prefix_cache_queries_total") == 64


def test_histograms_and_gauges_follow_the_requests() -> None:
    cfg = EmulatorConfig(profile="tiny-cpu", num_gpu_blocks=512, step_noise=0.0, stats_interval_s=0)
    with start_emulator(cfg) as emu, httpx.Client(base_url=emu.url, timeout=10) as c:
        ids = list(range(100, 1124))
        with httpx.Client(base_url=emu.url, timeout=10) as streaming, streaming.stream(
                "POST", "/v1/completions", json={"prompt": ids, "max_tokens": 400, "stream": True}) as r:
            lines = r.iter_lines()
            next(lines)
            pub = emu.published()
            assert pub.running == 1 and pub.kv_usage > 0  # 33 of 511 blocks held
            text = c.get("/metrics").text
            assert value(text, "vllm:num_requests_running") == 1
            for _ in lines:
                pass
        text = c.get("/metrics").text
        assert value(text, "vllm:kv_cache_usage_perc") == 0  # freed cached blocks count as free
        assert value(text, "vllm:time_to_first_token_seconds_count") == 1
        # One 1024-token prefill step of the tiny-cpu model takes 1.5 + 5 + 1024 x 0.0145 ms.
        assert value(text, "vllm:time_to_first_token_seconds_sum") >= 0.0213
        assert value(text, "vllm:e2e_request_latency_seconds_count") == 1
        assert value(text, "vllm:generation_tokens_total") == 400
        assert value(text, "vllm:request_generation_tokens_sum") == 400
        assert value(text, "vllm:inter_token_latency_seconds_count") == 399
