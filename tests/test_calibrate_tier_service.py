"""Tier service times: the fits from a server's transfer counters, the verdict, the offload config written."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from blis_sim.calibrate.tier_service import (TierWindow, compare_tier_service, derive_tier_service, fit_windows,
                                            offload_config_text)
from blis_sim.formats.trace_header import TierIO, TraceHeader, read_trace_header, write_trace_header
from blis_sim.observe.metrics import derive_window, parse_exposition


def test_one_window_gives_the_effective_bandwidth() -> None:
    f = fit_windows("1:fs", "read", [TierWindow(bytes=2e6, seconds=1e-3)])
    assert (f.method, f.bandwidth_Bps, f.fixed_cost_s) == ("bandwidth-only", 2e9, None)


def test_windows_of_different_transfer_sizes_fit_cost_and_bandwidth() -> None:
    # 4 GB/s and 30 µs per transfer: 10 transfers of 1 MB, then 5 of 4 MB
    ws = [TierWindow(bytes=n * s, seconds=n * (30e-6 + s / 4e9), jobs=n) for n, s in ((10, 1e6), (5, 4e6))]
    f = fit_windows("0:primary", "read", ws)
    assert f.method == "lstsq" and f.bandwidth_Bps == pytest.approx(4e9) and f.fixed_cost_s == pytest.approx(30e-6)
    assert f.jobs == 15 and f.windows == 2


@pytest.mark.parametrize("windows", [
    [TierWindow(1e6, 1e-3, 10), TierWindow(2.05e6, 2e-3, 20)],   # mean sizes within MIN_SIZE_SPREAD
    [TierWindow(1e6, 1e-3, 10), TierWindow(4e6, 2e-3, None)],    # a window without transfer counts
])
def test_without_identifying_windows_it_stays_bandwidth_only(windows: list[TierWindow]) -> None:
    f = fit_windows("0:primary", "write", windows)
    assert f.method == "bandwidth-only" and f.fixed_cost_s is None
    assert f.bandwidth_Bps == pytest.approx(sum(w.bytes for w in windows) / sum(w.seconds for w in windows))


def _vllm_exposition(load: list[tuple[int, float]], store: list[tuple[int, float]],
                     fs: tuple[int, float, int, float] | None) -> str:
    """What vLLM 0.32's OffloadPromMetrics registers (names, labels, buckets), with these transfers; its
    series are created on the first observation, so an idle server exposes none. No `_created` samples
    (as vLLM serves them in multiprocess mode)."""
    reg = CollectorRegistry()
    base = ["model_name", "engine"]
    buckets = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)
    for way, transfers in (("load", load), ("store", store)):
        nbytes = Counter(f"vllm:kv_offload_{way}_bytes", "d", labelnames=base, registry=reg)
        secs = Counter(f"vllm:kv_offload_{way}_time", "d", labelnames=base, registry=reg)
        size = Histogram(f"vllm:kv_offload_{way}_size", "d", labelnames=base, buckets=buckets, registry=reg)
        for b, s in transfers:
            nbytes.labels("m", "0").inc(b)
            secs.labels("m", "0").inc(s)
            size.labels("m", "0").observe(b)
    if fs is not None:
        for i, way in enumerate(("read", "write")):
            Counter(f"vllm:kv_offload_tiering_{way}_bytes", "d", labelnames=base + ["tier"],
                    registry=reg).labels("m", "0", "1:fs").inc(fs[2 * i])
            Counter(f"vllm:kv_offload_tiering_{way}_time", "d", labelnames=base + ["tier"],
                    registry=reg).labels("m", "0", "1:fs").inc(fs[2 * i + 1])
    # two registries stand for one server at two moments: their `_created` samples would read as a restart
    return "".join(line for line in generate_latest(reg).decode().splitlines(keepends=True)
                   if "_created" not in line)


def test_observe_reads_vllms_transfer_series_into_tier_io() -> None:
    start = parse_exposition(_vllm_exposition([], [], None))
    end = parse_exposition(_vllm_exposition([(4_000_000, 1e-3), (2_000_000, 0.5e-3)], [(1_000_000, 0.1e-3)],
                                            (3_000_000, 2e-3, 6_000_000, 5e-3)))
    w = derive_window(start, end, model="m")
    assert w.tier_io["0:primary"] == pytest.approx({"read_bytes": 6e6, "read_time_s": 1.5e-3, "read_jobs": 2,
                                                    "write_bytes": 1e6, "write_time_s": 0.1e-3, "write_jobs": 1})
    assert w.tier_io["1:fs"] == pytest.approx({"read_bytes": 3e6, "read_time_s": 2e-3, "write_bytes": 6e6,
                                               "write_time_s": 5e-3})


def test_the_reference_time_totals_stay_the_tiering_familys() -> None:
    hits = ('vllm:kv_offload_tiering_chunk_queries_total{engine="0",model_name="m",tier="0:primary"} %d\n'
            'vllm:kv_offload_tiering_chunk_hits_total{engine="0",model_name="m",tier="0:primary"} %d\n')
    start = parse_exposition(_vllm_exposition([], [], (0, 0.0, 0, 0.0)) + hits % (0, 0))
    end = parse_exposition(_vllm_exposition([(1000, 1.0)], [(1000, 2.0)], (10, 0.5, 10, 0.25)) + hits % (4, 2))
    observed = derive_window(start, end, model="m").observed
    assert observed is not None and observed["source"] == "tiered"
    assert (observed["read_time_total"], observed["write_time_total"]) == (0.5, 0.25)  # not the GPU <-> CPU times


def _io(tier: str, **kw: Any) -> TierIO:
    return TierIO(tier=tier, **kw)


def test_verdict_per_tier_and_direction_with_notes() -> None:
    observed = [_io("0:primary", read_bytes=1000, read_time_s=1.0, write_bytes=500, write_time_s=0.0),
                _io("1:fs", read_bytes=800, read_time_s=2.0)]
    simulated = [_io("0:primary", read_bytes=1000, read_time_s=1.05, read_jobs=3, write_bytes=500, write_time_s=0.1)]
    rows, notes = compare_tier_service(observed, simulated, 0.10)
    assert [(r.tier, r.direction, r.within) for r in rows] == [("0:primary", "read", True)]
    assert rows[0].rel_error == pytest.approx(0.05) and rows[0].sim_bandwidth_Bps == pytest.approx(1000 / 1.05)
    assert any("0:primary/write" in n and "no transfer time" in n for n in notes)
    assert any("1:fs/read" in n and "no tier '1:fs'" in n for n in notes)
    rows, notes = compare_tier_service(observed[:1], [_io("0:primary", read_bytes=2000, read_time_s=2.0)], 0.10)
    assert not rows[0].within and any("traffic gap" in n for n in notes)


def test_old_headers_without_transfer_counts_still_read(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("trace_version: 3\ntime_unit: us\nmode: real\npytest_blis:\n    tier_io:\n"
                    "        - tier: 1:fs\n          read_bytes: 10\n          write_bytes: 0\n"
                    "          read_time_s: 0.5\n          write_time_s: 0\n")
    t = read_trace_header(path).pytest_blis.tier_io[0]  # type: ignore[union-attr]
    assert (t.read_jobs, t.write_jobs, t.read_bytes) == (None, None, 10)
    header = TraceHeader(mode="real", pytest_blis={"tier_io": [t.model_copy(update={"read_jobs": 4})]})
    write_trace_header(header, tmp_path / "new.yaml")
    assert read_trace_header(tmp_path / "new.yaml").pytest_blis.tier_io[0].read_jobs == 4  # type: ignore[union-attr]


def test_the_written_offload_config_loads_with_the_fitted_bandwidths(tmp_path: Path) -> None:
    from blis_sim.formats.offload import load_offload_config
    from blis_sim.formats.trace_header import TraceKVOffloadConfig, TraceTierConfig

    block = TraceKVOffloadConfig(cpu_bytes_to_use=1 << 20, per_block_bytes=8192, block_size=16, blocks_per_chunk=1,
                                 tokens_per_hash=16, eviction_policy="lru", offload_prompt_only=True,
                                 secondary_tiers=[TraceTierConfig(type="fs", root_dir="/tmp/x", n_read_threads=4,
                                                                  n_write_threads=2, direct_io=True,
                                                                  read_bandwidth=7000, write_bandwidth=5000,
                                                                  base_latency=80)])
    fits = derive_tier_service([[_io("1:fs", read_bytes=3_000_000, read_time_s=1e-3),
                                 _io("0:primary", write_bytes=10, write_time_s=1e-6)]])
    path = tmp_path / "fitted.yaml"
    path.write_text(offload_config_text(block, fits))
    cfg = load_offload_config(path, kv_bytes_per_token=512, gpu_block_size=16)
    (tier,) = cfg.secondary_tiers
    assert tier.read_bandwidth == pytest.approx(3000.0)  # bytes/µs, fitted
    assert tier.write_bandwidth == 5000 and tier.base_latency == 0.0  # not observed: kept; latency folded in
    assert (tier.n_read_threads, tier.n_write_threads, cfg.cpu_bytes_to_use) == (4, 2, 1 << 20)
    assert "0:primary write" in path.read_text() and cfg.cpu_link is None  # one direction fitted: no link
    # both of the link's directions fitted: the config carries them as cpu_link, and replay's KV uses them
    fits = derive_tier_service([[_io("0:primary", read_bytes=8_000_000, read_time_s=1e-2, write_bytes=1_000_000,
                                     write_time_s=1e-2)]])
    path.write_text(offload_config_text(block, fits))
    cfg = load_offload_config(path, kv_bytes_per_token=512, gpu_block_size=16)
    assert cfg.cpu_link is not None
    assert (cfg.cpu_link.read_bandwidth, cfg.cpu_link.write_bandwidth) == (pytest.approx(800.0), pytest.approx(100.0))
    from blis_sim.engine.simulate import build_kv
    link = build_kv(64, 16, cfg, 0).config.cpu.link
    assert (link.read_bandwidth, link.write_bandwidth, link.base_latency) == (pytest.approx(800.0),
                                                                             pytest.approx(100.0), 0.0)
    # and the trace header keeps it (pytest_blis.offload.cpu_link), so a replay of a replay uses it too
    from blis_sim.formats.offload import OffloadConfig
    again = OffloadConfig.from_header(cfg.to_header(), cfg.extensions())
    assert again.cpu_link == cfg.cpu_link and again.equivalent(cfg)


def test_a_bad_cpu_link_is_reported_with_its_line(tmp_path: Path) -> None:
    from blis_sim.errors import ConfigErrors
    from blis_sim.formats.offload import load_offload_config

    path = tmp_path / "bad.yaml"
    path.write_text("kv_offload:\n  cpu_bytes_to_use: 1048576\n  cpu_link:\n    read_bandwidth: 0\n"
                    "    write_bandwidth: .nan\n    base_latency: -1\n")
    with pytest.raises(ConfigErrors) as exc:
        load_offload_config(path, kv_bytes_per_token=512, gpu_block_size=16)
    text = str(exc.value)
    assert "3 problems" in text
    assert "bad.yaml:4: field 'kv_offload.cpu_link.read_bandwidth': kv_offload: cpu_link.read_bandwidth must be a " \
           "finite number > 0 (bytes/us), got 0.0" in text
    assert "bad.yaml:5: field 'kv_offload.cpu_link.write_bandwidth'" in text and "got nan" in text
    assert "bad.yaml:6: field 'kv_offload.cpu_link.base_latency'" in text


def test_calibrate_compares_tier_service_and_writes_a_config_replay_accepts(tmp_path: Path) -> None:
    """observe against the emulator over HTTP, replay, calibrate: the fs tier matches (same bandwidths on
    both sides); the written config, replayed, gives the same fs service time."""
    from blis_sim.cli import main as blis_main
    from blis_sim.emulator import EmulatorConfig, start_emulator
    from blis_sim.formats.workload import parse_workload_spec
    from blis_sim.observe.run import ObserveOptions, observe, write_result

    offload = tmp_path / "offload.yaml"
    offload.write_text(f"kv_offload:\n  cpu_bytes_to_use: {8 * 16 * 512}\n  secondary_tiers:\n"
                       "    - {type: fs, root_dir: /tmp/blis-tier-service, direct_io: true, read_bandwidth: 2000,\n"
                       "       write_bandwidth: 1000, base_latency: 0, n_read_threads: 2, n_write_threads: 2}\n")
    clients = "".join(
        f"  - {{id: g{i}, rate_fraction: 0.25, streaming: true, prefix_group: p{i}, prefix_length: 96, "
        "arrival: {process: constant}, input_distribution: {type: constant, params: {value: 16}}, "
        "output_distribution: {type: constant, params: {value: 2}}}\n" for i in range(4))
    spec = parse_workload_spec(f'version: "2"\nseed: 5\naggregate_rate: 50\nnum_requests: 40\nclients:\n{clients}')
    cfg = EmulatorConfig(profile="zero", block_size=16, num_gpu_blocks=24, max_model_len=256,
                         kv_offload_config=str(offload), enable_prompt_tokens_details=True)
    with start_emulator(cfg) as emu:
        result = observe(emu.url, spec, ObserveOptions(model="tiny-llama", max_concurrency=1, scrape_kv_metrics=True,
                                                       settle_s=0.2, progress=False, timeout_s=5.0))
    header, data = tmp_path / "t.yaml", tmp_path / "t.csv"
    write_result(result, header, data)

    def replay_and_calibrate(config: Path, tag: str) -> dict[str, Any]:
        sim, metrics, report = (tmp_path / f"{tag}-{n}" for n in ("sim.json", "m.json", "r.json"))
        assert blis_main(["replay", "--trace-header", str(header), "--trace-data", str(data), "--sequential",
                          "--model", "tiny-llama", "--kv-offload-config", str(config), "--results-path", str(sim),
                          "--metrics-path", str(metrics)]) == 0
        blis_main(["calibrate", "--trace-header", str(header), "--trace-data", str(data), "--sim-results", str(sim),
                   "--sim-metrics", str(metrics), "--report", str(report), "--ttft-mape-threshold", "1e9",
                   "--write-offload-config", str(tmp_path / f"{tag}-fitted.yaml")])
        return json.loads(report.read_text())

    first = replay_and_calibrate(offload, "a")
    rows = {(r["tier"], r["direction"]): r for r in first["tier_service"]}
    assert set(rows) == {("0:primary", "read"), ("0:primary", "write"), ("1:fs", "read"), ("1:fs", "write")}
    for d, bw in (("read", 2e9), ("write", 1e9)):
        assert rows[("1:fs", d)]["within"] and rows[("1:fs", d)]["rel_error"] < 1e-6
        assert abs(rows[("1:fs", d)]["real_bandwidth_Bps"] - bw) <= 0.05 * bw
    assert first["provenance"]["tier_service_tolerance"] == 0.1
    fits = {(f["tier"], f["direction"]): f for f in first["tier_service_fits"]}
    assert fits[("0:primary", "read")]["method"] == "bandwidth-only"
    second = replay_and_calibrate(tmp_path / "a-fitted.yaml", "b")
    again = {(r["tier"], r["direction"]): r for r in second["tier_service"]}
    for d in ("read", "write"):
        assert again[("1:fs", d)]["sim_seconds"] == pytest.approx(rows[("1:fs", d)]["sim_seconds"], rel=1e-9)


SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "blis"


@pytest.mark.parametrize("extra,message", [
    (["--write-offload-config", "x.yaml"], "--write-offload-config needs --sim-metrics from a replay with an "
                                           "offload config"),
    (["--tier-service-tolerance", "-1"], "--tier-service-tolerance must be a finite number >= 0"),
    (["--tier-window", "missing.yaml"], "missing.yaml"),
])
def test_cli_refuses_what_it_cannot_use(extra: list[str], message: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from blis_sim.cli import main as blis_main

    argv = ["calibrate", "--trace-header", str(SAMPLES / "trace-observed.yaml"), "--trace-data",
            str(SAMPLES / "trace.csv"), "--sim-results", str(SAMPLES / "sim.json"), "--sim-metrics",
            str(SAMPLES / "simagg.json"), "--report", str(tmp_path / "r.json")]
    assert blis_main(argv + [a if not a.endswith(".yaml") else str(tmp_path / a) for a in extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not (tmp_path / "r.json").exists()
