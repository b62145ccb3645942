"""The counter-window logic: real vLLM 0.32 expositions, then every source of design D2 and every miss."""
from __future__ import annotations

from pathlib import Path

import pytest

from blis_sim.errors import ScrapeError
from blis_sim.observe.metrics import derive_window, kv_geometry, parse_exposition

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "vllm-cpu"


def _snap(text: str):  # type: ignore[no-untyped-def]
    return parse_exposition(text, url="http://h/metrics")


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="samples/ missing from the checkout")
def test_real_vllm_032_window_is_61_1_percent_gpu_fallback() -> None:
    start = _snap((SAMPLES / "metrics-before.txt").read_text())
    end = _snap((SAMPLES / "metrics-after.txt").read_text())
    w = derive_window(start, end, vllm_commit="0" * 40, model="tiny-llama")
    assert w.observed == {"source": "gpu-prefix-cache-fallback", "hit_rate": pytest.approx(29696 / 48579),
                          "block_hits": 29696, "block_queries": 48579, "vllm_commit": "0" * 40}
    assert round(100 * w.observed["hit_rate"], 1) == 61.1
    by_def = {(e["definition"], e["tier"]): e for e in w.hit_rates}
    assert by_def[("prefix_cache", None)]["metric"] == "vllm:prefix_cache_hits_total"
    assert by_def[("by_source", "device")]["hits"] == 29696
    assert by_def[("by_source", "host")]["hits"] == 0
    assert ("external", None) not in by_def  # zero external queries: nothing to compare
    assert kv_geometry(end) == {"block_size": 32, "num_gpu_blocks": 512}
    assert w.server_ttft is not None and w.server_ttft["count"] == 81


def _expo(values: dict[str, float], created: float = 100.0) -> str:
    lines = []
    for series, v in values.items():
        lines.append(f"{series} {v}")
    lines.append(f'vllm:prefix_cache_queries_created{{engine="0",model_name="m"}} {created}')
    return "\n".join(lines) + "\n"


Q0 = 'vllm:prefix_cache_queries_total{engine="0",model_name="m"}'
H0 = 'vllm:prefix_cache_hits_total{engine="0",model_name="m"}'
Q1 = 'vllm:prefix_cache_queries_total{engine="1",model_name="m"}'
H1 = 'vllm:prefix_cache_hits_total{engine="1",model_name="m"}'


def test_engines_are_summed_and_model_filter_applies() -> None:
    start = _snap(_expo({Q0: 10, H0: 0, Q1: 10, H1: 0,
                         'vllm:prefix_cache_queries_total{engine="0",model_name="other"}': 0}))
    end = _snap(_expo({Q0: 110, H0: 40, Q1: 60, H1: 10,
                       'vllm:prefix_cache_queries_total{engine="0",model_name="other"}': 1000}))
    w = derive_window(start, end, model="m")
    assert w.observed is not None and (w.observed["block_hits"], w.observed["block_queries"]) == (50, 150)


def test_counter_decrease_is_a_reset() -> None:
    w = derive_window(_snap(_expo({Q0: 100, H0: 50})), _snap(_expo({Q0: 20, H0: 5})))
    assert w.observed is None and w.miss_reason.startswith("counter reset") and "went backwards" in w.miss_reason
    assert not w.valid and w.hit_rates == []


def test_changed_created_is_a_reset_even_when_counters_grew() -> None:
    w = derive_window(_snap(_expo({Q0: 100, H0: 50}, created=100.0)),
                      _snap(_expo({Q0: 200, H0: 60}, created=200.0)))
    assert w.observed is None and "_created" in w.miss_reason


def test_vanished_series_is_a_reset() -> None:
    w = derive_window(_snap(_expo({Q0: 100, H0: 50, Q1: 5, H1: 1})), _snap(_expo({Q0: 200, H0: 60})))
    assert w.observed is None and "disappeared" in w.miss_reason


def test_zero_queries_and_impossible_hits_are_misses() -> None:
    w = derive_window(_snap(_expo({Q0: 100, H0: 50})), _snap(_expo({Q0: 100, H0: 50})))
    assert w.observed is None and "zero queries" in w.miss_reason
    w = derive_window(_snap(_expo({Q0: 100, H0: 50})), _snap(_expo({Q0: 110, H0: 70})))
    assert w.observed is None and "more hits (20) than queries (10)" in w.miss_reason


def test_no_recognized_counters_and_garbage() -> None:
    w = derive_window(_snap("http_requests_total 5\n"), _snap("http_requests_total 9\n"))
    assert w.observed is None and w.miss_reason.startswith("no recognized KV cache counters")
    with pytest.raises(ScrapeError, match="http://h/metrics: not Prometheus text"):
        _snap("<html><body>502 Bad Gateway</body></html>")


def _tiered(spelling: str, hits: dict[str, float], queries: dict[str, float], extra: str = "") -> str:
    out = []
    for tier, v in queries.items():
        out.append(f'vllm:kv_offload_tiering_{spelling}_queries_total{{engine="0",model_name="m",tier="{tier}"}} {v}')
    for tier, v in hits.items():
        out.append(f'vllm:kv_offload_tiering_{spelling}_hits_total{{engine="0",model_name="m",tier="{tier}"}} {v}')
    return "\n".join(out) + "\n" + extra


@pytest.mark.parametrize("spelling", ["chunk", "block"])
def test_tiered_wins_over_prefix_cache_and_keeps_tiers(spelling: str) -> None:
    io0 = ('vllm:kv_offload_tiering_read_time_total{engine="0",model_name="m",tier="1:fs"} 1.0\n'
           'vllm:kv_offload_tiering_read_bytes_total{engine="0",model_name="m",tier="1:fs"} 100\n'
           'vllm:kv_offload_tiering_write_time_total{engine="0",model_name="m",tier="0:primary"} 0.5\n')
    io1 = ('vllm:kv_offload_tiering_read_time_total{engine="0",model_name="m",tier="1:fs"} 3.5\n'
           'vllm:kv_offload_tiering_read_bytes_total{engine="0",model_name="m",tier="1:fs"} 900\n'
           'vllm:kv_offload_tiering_write_time_total{engine="0",model_name="m",tier="0:primary"} 1.75\n')
    start = _snap(_tiered(spelling, {"0:primary": 0}, {"0:primary": 0}, _expo({Q0: 0, H0: 0}) + io0))
    end = _snap(_tiered(spelling, {"0:primary": 6, "1:fs": 2}, {"0:primary": 10, "1:fs": 4},
                        _expo({Q0: 1000, H0: 500}) + io1))
    w = derive_window(start, end, vllm_commit="c")
    assert w.observed == {"source": "tiered", "hit_rate": pytest.approx(8 / 14), "block_hits": 8,
                          "block_queries": 14, "read_time_total": pytest.approx(2.5),
                          "write_time_total": pytest.approx(1.25), "vllm_commit": "c"}
    tiers = {e["tier"]: (e["hits"], e["queries"], e["unit"], e["metric"]) for e in w.hit_rates
             if e["definition"] == "tiered"}
    metric = f"vllm:kv_offload_tiering_{spelling}_hits_total"
    assert tiers == {"0:primary": (6, 10, "chunks", metric), "1:fs": (2, 4, "chunks", metric),
                     None: (8, 14, "chunks", metric)}
    assert w.tier_io["1:fs"] == {"read_time_s": 2.5, "read_bytes": 800}
    assert any(e["definition"] == "prefix_cache" and e["hits"] == 500 for e in w.hit_rates)


def test_external_and_by_source_and_legacy() -> None:
    def expo(q: float, h: float, eq: float, eh: float, dev: float, host: float, gq: float, gh: float) -> str:
        lab = 'engine="0",model_name="m"'
        return "\n".join([
            f"vllm:prefix_cache_queries_total{{{lab}}} {q}", f"vllm:prefix_cache_hits_total{{{lab}}} {h}",
            f"vllm:external_prefix_cache_queries_total{{{lab}}} {eq}",
            f"vllm:external_prefix_cache_hits_total{{{lab}}} {eh}",
            f'vllm:prompt_tokens_cached_by_source_total{{{lab},source="device"}} {dev}',
            f'vllm:prompt_tokens_cached_by_source_total{{{lab},source="host"}} {host}',
            f"vllm:gpu_prefix_cache_queries_total{{{lab}}} {gq}", f"vllm:gpu_prefix_cache_hits_total{{{lab}}} {gh}",
        ]) + "\n"

    w = derive_window(_snap(expo(0, 0, 0, 0, 0, 0, 0, 0)), _snap(expo(1000, 300, 700, 200, 300, 200, 1000, 300)))
    got = {(e["definition"], e["tier"]): (e["hits"], e["queries"]) for e in w.hit_rates}
    assert got == {("prefix_cache", None): (300, 1000), ("gpu_prefix_cache", None): (300, 1000),
                   ("external", None): (200, 700), ("by_source", "device"): (300, 1000),
                   ("by_source", "host"): (200, 1000)}
    # The current family is the primary one when both spellings are served (vLLM 0.10).
    assert w.observed is not None and w.observed["block_queries"] == 1000


def test_legacy_gauge_fallback_without_counters() -> None:
    w = derive_window(_snap("vllm:gpu_prefix_cache_hit_rate 0.25\n"), _snap("vllm:gpu_prefix_cache_hit_rate 0.4\n"))
    assert w.observed == {"source": "gpu-prefix-cache-fallback", "hit_rate": 0.4, "block_hits": 0,
                          "block_queries": 0}


def test_untyped_exposition_and_bare_names_match() -> None:
    """No TYPE lines, and counters without ``_total``: keyed on sample names either way."""
    start = _snap('vllm:prefix_cache_queries{engine="0"} 0\nvllm:prefix_cache_hits{engine="0"} 0\n')
    end = _snap('vllm:prefix_cache_queries{engine="0"} 64\nvllm:prefix_cache_hits{engine="0"} 32\n')
    w = derive_window(start, end)
    assert w.observed is not None and w.observed["hit_rate"] == 0.5
