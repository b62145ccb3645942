"""`blis probe`: its plan (bounded, covering lengths, batch sizes and the ramp) and its run against the real
emulator HTTP server (limits read from /v1/models and vllm:cache_config_info, time budget, ramp throughput)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from blis_sim.cli import main as blis_main
from blis_sim.emulator import EmulatorConfig, FaultConfig, start_emulator
from blis_sim.errors import ConfigError, ServerError
from blis_sim.formats.trace import load_trace
from blis_sim.probe import ProbeConfig, ProbeOptions, ServerLimits, probe_plan, read_limits, run_probe
from blis_sim.probe.plan import max_in_flight, one_at_a_time, replayed_only

H100 = ServerLimits(max_model_len=40960, block_size=16, num_gpu_blocks=17600, max_num_seqs=1024)
# a small server: 8 sequences, 1024-token context, 256 blocks of 16 (4096 tokens)
SMALL = dict(profile="zero", block_size=16, num_gpu_blocks=256, max_model_len=1024, max_num_seqs=8,
             max_num_batched_tokens=2048)


def names(limits: ServerLimits, config: ProbeConfig = ProbeConfig()) -> list[str]:
    return [p.name for p in probe_plan(limits, config).phases]


def test_plan_covers_lengths_batches_mixed_steps_and_the_ramp() -> None:
    plan = probe_plan(H100)
    got = [p.name for p in plan.phases]
    cold = sorted({int(n.split("-")[1]) for n in got if n.startswith("cold-")})
    # doubling from 64 up to the longest the server takes within a quarter of its cache (whole blocks)
    assert cold[:3] == [64, 128, 256] and cold[-1] == min(40960 - 36, 16 * 17600 // 4) // 16 * 16
    decode = [int(n.split("-")[1]) for n in got if n.startswith("decode-") and "ctx" not in n]
    assert decode == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]  # up to max_num_seqs
    assert any("ctx" in n for n in got) and [n for n in got if n.startswith("mixed-")]
    mixed = next(p for p in plan.phases if p.name.startswith("mixed-"))
    assert {r.arrival_us for r in mixed.requests} == {0, 100_000, 300_000}  # prefills land mid-decode
    assert [n for n in got if n.startswith("ramp-")] == [f"ramp-{n}" for n in (2, 4, 8, 16, 32, 64, 128, 256)]
    # bounded: a few thousand requests at most, and a phase never exceeds max_num_seqs (+ the mixed prefills)
    assert sum(len(p.requests) for p in plan.phases) < 3000 and max_in_flight(plan) <= 1024


def test_plan_follows_the_server_and_the_caps() -> None:
    small = ServerLimits(max_model_len=1024, block_size=16, num_gpu_blocks=256, max_num_seqs=8)
    got = names(small)
    assert max(int(n.split("-")[1]) for n in got if n.startswith("cold-")) == 976  # 1024 - 36, whole blocks
    assert max(int(n.split("-")[1]) for n in got if n.startswith("decode-")) == 8
    got = names(H100, ProbeConfig(max_prompt=2048, decode_max=16, ramp_max=32))
    assert [n for n in got if not n.startswith("cold-")][-1] == "ramp-32"
    capped = names(H100, ProbeConfig(max_prompt=2048, decode_max=16, ramp_max=1, mixed=False))
    assert not any(n.startswith(("ramp", "mixed")) for n in capped)
    assert max(int(n.split("-")[1]) for n in capped if n.startswith("cold-")) == 2048
    with pytest.raises(ConfigError, match="max_model_len"):
        probe_plan(ServerLimits(max_model_len=64, block_size=16, num_gpu_blocks=256))
    with pytest.raises(ConfigError, match="num_gpu_blocks"):
        ServerLimits(max_model_len=64, block_size=16, num_gpu_blocks=0)


def test_cold_samples_of_a_length_are_spread_over_the_probe() -> None:
    """Three passes over the lengths: beside the seeds, after the decode batches, last. A slow stretch of
    seconds on a shared host then meets one sample of each length, not all of them."""
    got = names(H100)
    first = {n: i for i, n in enumerate(got)}
    lengths = sorted({int(n.split("-")[1]) for n in got if n.startswith("cold-")})
    for length in lengths:
        at = [first[f"cold-{length}-{k}"] for k in range(3)]
        assert at[0] < first[f"seed-{length}"] < first["decode-1"] < at[1] < first["ramp-2"] < at[2]
    assert got[-len(lengths):] == [f"cold-{length}-2" for length in lengths]
    # the second pass comes after the seeded prefixes' last use (their 512-token repeats)
    assert max(i for n, i in first.items() if n.startswith("cached-")) < first[f"cold-{lengths[0]}-1"]


LANE = ServerLimits(max_model_len=8192, block_size=32, num_gpu_blocks=4096, max_num_seqs=32,
                   max_num_batched_tokens=2048)


def test_sustain_phase_holds_a_queue_of_short_mixed_requests() -> None:
    plan = probe_plan(LANE, ProbeConfig(max_prompt=4096, decode_max=64, ramp_max=64))
    busy = [p for p in plan.phases if not p.name.startswith("cold-")]  # the last cold pass follows it
    last = busy[-1]
    assert [p.name for p in busy][-2:] == ["ramp-64", "sustain-96"]  # 3 x max_num_seqs
    prompts = [r.input_tokens for r in last.requests]
    outputs = [r.output_tokens for r in last.requests]
    assert min(prompts) == 64 and max(prompts) == 512 and min(outputs) == 16 and max(outputs) == 48
    assert len(set(zip(prompts, outputs))) == 96 and 31 <= sum(outputs) / 96 <= 33
    # the first batch the server runs already spans both ranges (they are interleaved, not ascending)
    first = last.requests[:32]
    assert max(r.input_tokens for r in first) - min(r.input_tokens for r in first) > 400
    assert max(r.output_tokens for r in first) - min(r.output_tokens for r in first) > 24
    assert max_in_flight(plan) == 96


def test_no_sustain_phase_where_nothing_queues_and_the_ramp_stops_at_twice_the_batch() -> None:
    within = names(LANE, ProbeConfig(max_prompt=4096, decode_max=32, ramp_max=32))
    assert [n for n in within if not n.startswith("cold-")][-1] == "ramp-32" and not any(n.startswith("sustain") for n in within)
    # cells that send hundreds at once: the ramp still stops at 2 x max_num_seqs
    wide = names(LANE, ProbeConfig(max_prompt=4096, decode_max=480, ramp_max=480))
    assert [n for n in wide if n.startswith(("ramp-", "sustain-"))][-2:] == ["ramp-64", "sustain-96"]
    # a cache too small for 3 x max_num_seqs short requests in half of it: none
    small = ServerLimits(max_model_len=1024, block_size=16, num_gpu_blocks=256, max_num_seqs=8)
    assert not any(n.startswith("sustain") for n in names(small))


def test_with_a_sustain_phase_the_ramp_is_replayed_but_not_fitted() -> None:
    lane = names(LANE, ProbeConfig(max_prompt=4096, decode_max=64, ramp_max=64))
    assert replayed_only(lane) == {n for n in lane if n.startswith("ramp-")} == {
        "ramp-2", "ramp-4", "ramp-8", "ramp-16", "ramp-32", "ramp-64"}
    within = names(LANE, ProbeConfig(max_prompt=4096, decode_max=32, ramp_max=32))  # no sustain: all fitted
    assert replayed_only(within) == frozenset()
    assert replayed_only(["ramp-2", "sustain-96", "steady"]) == frozenset()  # not a probe trace


def test_the_phases_that_send_one_request_at_a_time() -> None:
    lane = names(LANE, ProbeConfig(max_prompt=4096, decode_max=64, ramp_max=64))
    alone = one_at_a_time(lane)
    assert {"cold-4096-0", "seed-4096", "cached-4096-1", "cached-4096-2", "decode-1", "decode-1-ctx2048"} <= alone
    assert all(n.startswith(("cold-", "seed-", "cached-", "decode-1")) for n in alone)
    assert not alone & {"decode-16", "decode-16-ctx2048", "mixed-4-512", "ramp-2", "sustain-96", "warmup-0"}
    assert one_at_a_time(["cold-64-0", "steady"]) == frozenset()  # not a probe trace


def test_limits_come_from_the_server() -> None:
    with start_emulator(EmulatorConfig(**SMALL)) as emu:  # type: ignore[arg-type]
        limits = read_limits(emu.url, model="tiny-llama", max_num_seqs=8)
        assert (limits.max_model_len, limits.block_size, limits.num_gpu_blocks, limits.max_num_seqs) == \
            (1024, 16, 256, 8)
        assert read_limits(emu.url, block_size=32).block_size == 32  # an override wins
        with pytest.raises(ServerError, match="'nope' is not served"):
            read_limits(emu.url, model="nope")


def test_limits_the_server_does_not_give_must_be_passed() -> None:
    with start_emulator(EmulatorConfig(**SMALL)) as emu:  # type: ignore[arg-type]
        emu.set_faults(FaultConfig(metrics="http500"))  # /metrics fails: no cache_config_info
        with pytest.raises(ConfigError, match="block_size.*--block-size"):
            read_limits(emu.url)
        assert read_limits(emu.url, block_size=16, num_gpu_blocks=256).max_model_len == 1024


def _probe(emu: Any, budget: float, **config: Any) -> Any:
    limits = read_limits(emu.url, max_num_seqs=8)
    return run_probe(emu.url, limits, ProbeConfig(**config), ProbeOptions(model="tiny-llama", time_budget_s=budget,
                                                                          progress=False))


def test_a_probe_runs_every_phase_and_measures_the_ramp(tmp_path: Path) -> None:
    from blis_sim.observe.run import write_result

    with start_emulator(EmulatorConfig(**{**SMALL, "profile": "tiny-cpu"})) as emu:  # type: ignore[arg-type]
        result = _probe(emu, 120.0, max_prompt=256, ramp_max=8)
    trace = result.observed.trace
    planned = probe_plan(result.limits, ProbeConfig(max_prompt=256, ramp_max=8))
    assert len(trace.records) == sum(len(p.requests) for p in planned.phases)
    # every request served, and nothing wrong with the probe; a late-sends note is about how busy
    # the machine running the test is (its asyncio loop), not about the probe
    assert all(r.status == "ok" for r in trace.records)
    assert [w for w in result.observed.warnings if not w.startswith("sends were late")] == []
    assert {r.phase for r in trace.records} == {p.name for p in planned.phases}
    # the ramp: throughput per level, rising with the level on this server (batched prefill)
    assert [r.level for r in result.ramp] == [2, 4, 8]
    assert result.ramp[-1].rps > result.ramp[0].rps and result.max_rps == max(r.rps for r in result.ramp)
    assert result.max_output_tps > 0
    write_result(result.observed, tmp_path / "p.yaml", tmp_path / "p.csv")
    assert len(load_trace(tmp_path / "p.yaml", tmp_path / "p.csv").records) == len(trace.records)


def test_the_time_budget_skips_the_phases_left(tmp_path: Path) -> None:
    with start_emulator(EmulatorConfig(**{**SMALL, "profile": "tiny-cpu"})) as emu:  # type: ignore[arg-type]
        result = _probe(emu, 0.3)
    planned = sum(len(p.requests) for p in probe_plan(result.limits).phases)
    assert 0 < len(result.observed.trace.records) < planned
    assert any("time budget of 0.3 s spent" in w and "phase(s) not run" in w for w in result.observed.warnings)
    assert not result.observed.interrupted  # a budget is planned, not an interruption


def test_cli_writes_the_trace_and_reports_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with start_emulator(EmulatorConfig(**SMALL)) as emu:  # type: ignore[arg-type]
        code = blis_main(["probe", "--server-url", emu.url, "--model", "tiny-llama", "--trace-header",
                          str(tmp_path / "p.yaml"), "--trace-data", str(tmp_path / "p.csv"), "--max-num-seqs", "8",
                          "--max-prompt", "128", "--ramp-max", "4", "--time-budget", "1m"])
    assert code == 0
    err = capsys.readouterr().err
    assert "server limits: max_model_len 1024, block size 16, 256 GPU blocks" in err
    assert "phase 3/" in err and "maximum throughput" in err and "next: blis fit" in err
    assert load_trace(tmp_path / "p.yaml", tmp_path / "p.csv").records


@pytest.mark.parametrize("argv,message", [
    (["--model", "m"], "--server-url is required"),
    (["--server-url", "http://127.0.0.1:1", "--model", "m", "--trace-header", "a", "--trace-data", "b",
      "--max-num-seqs", "0"], "--max-num-seqs must be > 0"),
    (["--server-url", "http://127.0.0.1:1", "--model", "m", "--trace-header", "a", "--trace-data", "b",
      "--time-budget", "soon"], "invalid duration"),
])
def test_cli_input_errors_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert blis_main(["probe", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_unreachable_server_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = blis_main(["probe", "--server-url", "http://127.0.0.1:9", "--model", "m", "--trace-header",
                      str(tmp_path / "a.yaml"), "--trace-data", str(tmp_path / "a.csv")])
    assert code == 3 and "/v1/models" in capsys.readouterr().err
