"""`observe()` against the embedded vLLM emulator: every metric profile, every fault, hit-rates by hand.

Workload used for the hand computation (block size 32, one request at a time so the order is fixed):
four requests of one prefix group, 64 prefix tokens + 32 own tokens = 96 tokens each. The first
misses; each next one finds the 64-token prefix (2 full blocks) and nothing else of its own:
prefix-cache hits = 3 × 64 = 192 of 4 × 96 = 384 queried tokens = 50 %.
"""
from __future__ import annotations

from typing import Any

import pytest

from blis_sim.emulator import EmulatorConfig, FaultConfig, OffloadSpec, TierSpec, start_emulator
from blis_sim.errors import UsageError
from blis_sim.formats.workload import parse_workload_spec
from blis_sim.observe.run import ObserveOptions, ObserveResult, observe

SPEC = """
version: "2"
seed: 9
aggregate_rate: 100
num_requests: 4
clients:
  - {id: g, rate_fraction: 1, streaming: true, prefix_group: sys, prefix_length: 64, arrival: {process: constant},
     input_distribution: {type: constant, params: {value: 32}}, output_distribution: {type: constant, params: {value: 4}}}
"""


def _run(cfg: EmulatorConfig, spec: str = SPEC, **kw: Any) -> ObserveResult:
    opts: dict[str, Any] = dict(model="tiny-llama", max_concurrency=1, scrape_kv_metrics=True, settle_s=0.2,
                                progress=False, timeout_s=5.0)
    opts.update(kw)
    with start_emulator(cfg) as emu:
        return observe(emu.url, parse_workload_spec(spec), ObserveOptions(**opts))


def _cfg(**kw: Any) -> EmulatorConfig:
    base: dict[str, Any] = dict(block_size=32, num_gpu_blocks=256, enable_prompt_tokens_details=True)
    base.update(kw)
    return EmulatorConfig(**base)


def _rates(result: ObserveResult) -> dict[tuple[str, str | None], tuple[int, int]]:
    extra = result.trace.header.pytest_blis
    assert extra is not None
    return {(e.definition, e.tier): (e.hits, e.queries) for e in extra.kv_hit_rates}


@pytest.mark.parametrize("http_client", ["lean", "aiohttp"])
def test_vllm_033_profile_hit_rates_by_hand(http_client: str) -> None:
    result = _run(_cfg(), http_client=http_client)
    rows = sorted(result.trace.records, key=lambda r: r.request_id)
    assert [(r.status, r.server_input_tokens, r.cached_tokens) for r in rows] == \
        [("ok", 96, 0)] + [("ok", 96, 64)] * 3
    o = result.trace.header.observed_kv_metrics
    assert o is not None and (o.source, o.block_hits, o.block_queries, o.hit_rate) == \
        ("gpu-prefix-cache-fallback", 192, 384, 0.5)
    rates = _rates(result)
    assert rates[("prefix_cache", None)] == (192, 384)
    assert rates[("by_source", "device")] == (192, 384)
    assert rates[("by_source", "host")] == (0, 384)
    extra = result.trace.header.pytest_blis
    assert extra is not None and extra.vllm_version == "0.33.0"
    assert extra.kv_geometry is not None and (extra.kv_geometry.block_size, extra.kv_geometry.num_gpu_blocks) == \
        (32, 256)
    assert result.trace.header.server is not None and result.trace.header.server.block_size == 32
    assert all(r.output_tokens == 4 and r.finish_reason == "length" for r in rows)
    assert result.prompt_mode.startswith("exact") and not result.warnings


def test_http_client_is_checked() -> None:
    with pytest.raises(UsageError, match="--http-client"):
        ObserveOptions(model="m", http_client="curl").validate()


def test_legacy_vllm_011_profile() -> None:
    result = _run(_cfg(metrics_profile="vllm-0.11"))
    o = result.trace.header.observed_kv_metrics
    assert o is not None and (o.source, o.block_hits, o.block_queries) == ("gpu-prefix-cache-fallback", 192, 384)
    assert _rates(result) == {("gpu_prefix_cache", None): (192, 384)}


@pytest.mark.parametrize("profile,metric", [("vllm-0.33", "chunk"), ("vllm-pr48798", "block")])
def test_tiered_profiles_are_primary_with_per_tier_entries(profile: str, metric: str) -> None:
    offload = OffloadSpec(cpu_bytes=64 * 32 * 512, secondary_tiers=(TierSpec(),))
    result = _run(_cfg(metrics_profile=profile, offload=offload))
    o = result.trace.header.observed_kv_metrics
    assert o is not None and o.source == "tiered" and o.block_queries > 0
    entries = result.trace.header.pytest_blis.kv_hit_rates  # type: ignore[union-attr]
    tiered = {e.tier: e for e in entries if e.definition == "tiered"}
    assert set(tiered) == {"0:primary", "1:fs", None}
    assert all(e.metric == f"vllm:kv_offload_tiering_{metric}_hits_total" and e.unit == "chunks"
               for e in tiered.values())
    assert tiered[None].queries == o.block_queries == tiered["0:primary"].queries + tiered["1:fs"].queries
    # The GPU prefix cache is recorded too, as its own definition (never mixed with the tiered one).
    assert _rates(result)[("prefix_cache", None)] == (192, 384)
    tier_io = {t.tier: t for t in result.trace.header.pytest_blis.tier_io}  # type: ignore[union-attr]
    assert tier_io["1:fs"].write_bytes > 0  # cascaded stores; vLLM labels transfers by secondary tier only


def test_none_profile_is_a_miss_with_the_trace_kept() -> None:
    result = _run(_cfg(metrics_profile="none"))
    assert result.trace.header.observed_kv_metrics is None
    assert any("no recognized KV cache counters" in w for w in result.warnings)
    assert [r.status for r in result.trace.records] == ["ok"] * 4


def test_cached_tokens_not_reported_without_prompt_tokens_details() -> None:
    result = _run(_cfg(enable_prompt_tokens_details=False))
    assert [r.cached_tokens for r in result.trace.records] == [-1] * 4


def test_chat_api_and_non_streaming() -> None:
    result = _run(_cfg(), api_format="chat")
    assert all(r.status == "ok" and r.first_content_time_us >= r.first_chunk_time_us for r in result.trace.records)
    result = _run(_cfg(), no_streaming=True)
    assert all(r.status == "ok" and r.num_chunks == 1 and not r.streaming for r in result.trace.records)


@pytest.mark.parametrize("faults,status,message", [
    (FaultConfig(error_rate=1.0), "error", "HTTP 500"),
    (FaultConfig(error_rate=1.0, error_status=429), "error", "HTTP 429"),
    (FaultConfig(stream_cut_rate=1.0, stream_cut_after_tokens=1), "error", "streaming error"),
    (FaultConfig(stall_rate=1.0), "timeout", ""),
])
def test_request_faults_are_recorded_per_request(faults: FaultConfig, status: str, message: str) -> None:
    # 200 output tokens: the emulator cuts a stream only while its request is still generating, so the
    # request must outlast a loaded machine's scheduling hiccups.
    spec = SPEC.replace("params: {value: 4}", "params: {value: 200}")
    result = _run(_cfg(faults=faults), spec, timeout_s=10.0 if faults.stream_cut_rate else 1.0,
                  scrape_kv_metrics=False)
    assert len(result.trace.records) == 4
    assert all(r.status == status and message in r.error_message for r in result.trace.records), \
        [(r.status, r.error_message) for r in result.trace.records]


def test_first_token_delay_shows_in_client_ttft() -> None:
    result = _run(_cfg(faults=FaultConfig(first_token_delay_s=0.2)), scrape_kv_metrics=False)
    assert all(r.status == "ok" and r.first_content_time_us - r.send_time_us >= 200_000
               for r in result.trace.records)


@pytest.mark.parametrize("metrics_fault,reason", [
    ("http500", "HTTP 500"),
    ("drop", "scrape failed"),
    ("hang", "scrape failed"),
])
def test_metrics_faults_warn_and_keep_the_trace(metrics_fault: str, reason: str) -> None:
    result = _run(_cfg(faults=FaultConfig(metrics=metrics_fault)), timeout_s=1.0)  # type: ignore[arg-type]
    assert result.trace.header.observed_kv_metrics is None
    assert any(reason in w for w in result.warnings), result.warnings
    assert [r.status for r in result.trace.records] == ["ok"] * 4


def test_counter_reset_inside_the_window_is_a_miss() -> None:
    result = _run(_cfg(faults=FaultConfig(reset_counters_after=2)))
    assert result.trace.header.observed_kv_metrics is None
    assert any("counter reset" in w for w in result.warnings), result.warnings
    assert result.trace.header.pytest_blis.kv_hit_rates == []  # type: ignore[union-attr]


def _tier_spec(prefix_length: int, groups: int, requests: int) -> str:
    """``groups`` prefix groups sent in turn: with a GPU too small for all of them, each repeat loads its
    prefix back from the offload tiers (a CPU tier too small for all of them: from fs, by promotion)."""
    clients = "".join(
        f"  - {{id: g{i}, rate_fraction: {1 / groups}, streaming: true, prefix_group: p{i}, "
        f"prefix_length: {prefix_length}, arrival: {{process: constant}},\n"
        "     input_distribution: {type: constant, params: {value: 16}}, "
        "output_distribution: {type: constant, params: {value: 2}}}\n" for i in range(groups))
    return f'version: "2"\nseed: 5\naggregate_rate: 50\nnum_requests: {requests}\nclients:\n{clients}'


def test_tier_service_derivation_recovers_the_emulators_bandwidths() -> None:
    """vLLM's transfer series as the emulator serves them (its own station times), through observe over
    HTTP, give back every configured bandwidth: the host link (profile ``zero``: 10 GB/s, no latency) and
    the fs tier's reads (promotions) and writes (cascades)."""
    from blis_sim.calibrate.tier_service import derive_tier_service

    tier = TierSpec(read_bandwidth_Bps=2e9, write_bandwidth_Bps=1e9, latency_s=0.0, n_read_threads=2,
                    n_write_threads=2)
    cfg = _cfg(profile="zero", block_size=16, num_gpu_blocks=24, max_model_len=256,
               offload=OffloadSpec(cpu_bytes=8 * 16 * 512, secondary_tiers=(tier,)))
    result = _run(cfg, _tier_spec(96, 4, 40))
    tier_io = {t.tier: t for t in result.trace.header.pytest_blis.tier_io}  # type: ignore[union-attr]
    assert set(tier_io) == {"0:primary", "1:fs"}
    primary, fs = tier_io["0:primary"], tier_io["1:fs"]
    assert primary.read_jobs and primary.write_jobs and fs.read_jobs is None  # vLLM counts no fs jobs
    assert primary.read_bytes > 0 and fs.read_bytes > 0 and fs.write_bytes > 0
    fits = derive_tier_service([list(tier_io.values())])
    configured = {("0:primary", "read"): 10e9, ("0:primary", "write"): 10e9, ("1:fs", "read"): 2e9,
                  ("1:fs", "write"): 1e9}
    assert set(fits) == set(configured)
    for key, bw in configured.items():
        assert fits[key].method == "bandwidth-only"  # one window: bytes / seconds
        assert abs(fits[key].bandwidth_Bps - bw) <= 0.05 * bw, key


def test_two_windows_of_different_load_sizes_fit_the_per_transfer_cost() -> None:
    """With a per-transfer latency (profile ``tiny-cpu``'s host link: 10 GB/s + 20 µs) one window gives only
    an effective bandwidth; two windows whose loads differ in size give both, by least squares."""
    from blis_sim.calibrate.tier_service import derive_tier_service

    cfg = _cfg(profile="tiny-cpu", block_size=16, num_gpu_blocks=24, max_model_len=256,
               offload=OffloadSpec(cpu_bytes=64 * 16 * 512, secondary_tiers=(TierSpec(),)))
    windows = []
    with start_emulator(cfg) as emu:
        for prefix_length, groups in ((32, 12), (96, 4)):  # loads of 2 chunks, then of 6
            opts = ObserveOptions(model="tiny-llama", max_concurrency=1, scrape_kv_metrics=True, settle_s=0.2,
                                  progress=False, timeout_s=5.0)
            result = observe(emu.url, parse_workload_spec(_tier_spec(prefix_length, groups, 24)), opts)
            windows.append(list(result.trace.header.pytest_blis.tier_io))  # type: ignore[union-attr]
    one = derive_tier_service(windows[:1])[("0:primary", "read")]
    assert one.method == "bandwidth-only" and one.bandwidth_Bps < 0.5 * 10e9  # the latency folded in
    fit = derive_tier_service(windows)[("0:primary", "read")]
    assert fit.method == "lstsq" and fit.windows == 2
    assert abs(fit.bandwidth_Bps - 10e9) <= 0.05 * 10e9
    assert fit.fixed_cost_s is not None and abs(fit.fixed_cost_s - 20e-6) <= 0.05 * 20e-6
