"""How well the server repeats itself: the TTFT spread of the identical requests a probe sends alone.

The probe sends each prompt length four times alone and cold (``cold-L-0/1/2``, one at the start, in the middle
and at the end of the probe, and ``seed-L``: the same prompt length, nothing cached, the same output), and
twice with its prefix cached (``cached-L-0/1``). The spread of the cold samples includes the server's drift
over the probe's minutes.
No latency model can tell those apart, so the spread of their TTFTs around their own mean is a floor under
the TTFT MAPE of any model on a cell that sends such requests one at a time: the server's own repeatability on
this host. On a quiet machine it is a few %; on a shared VM whose speed moves (docs/vllm-cpu-calibration.md)
it can take most of a 15 % gate by itself. It is reported beside the verdicts and changes none of them.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from blis_sim.formats.trace import TraceRecord
from blis_sim.probe.plan import one_at_a_time


@dataclass(frozen=True)
class RepeatGroup:
    """Identical requests a probe sent alone: their prompt and cached tokens, how many, their mean TTFT and
    the mean absolute deviation of each from that mean, relative to each (a MAPE against the group's mean)."""

    prompt_tokens: int
    cached_tokens: int
    requests: int
    mean_ttft_us: float
    spread: float


def repeat_groups(records: Iterable[TraceRecord]) -> list[RepeatGroup]:
    """The groups of identical one-at-a-time requests (two or more, by prompt, cached and output tokens) in a
    probe trace's ``records``, by prompt length; empty for a trace that is not a probe's."""
    records = [r for r in records if r.status == "ok" and not r.warmup and r.first_chunk_time_us > 0]
    alone = one_at_a_time({r.phase for r in records})
    groups: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for r in records:
        if r.phase in alone:
            prompt = r.prefix_length + r.input_tokens
            groups[(prompt, _cached(r), r.output_tokens)].append(float(r.first_chunk_time_us - r.send_time_us))
    out = []
    for (prompt, cached, _), ttfts in sorted(groups.items()):
        if len(ttfts) < 2:
            continue
        mean = sum(ttfts) / len(ttfts)
        out.append(RepeatGroup(prompt, cached, len(ttfts), mean, sum(abs(t - mean) / t for t in ttfts) / len(ttfts)))
    return out


def _cached(r: TraceRecord) -> int:
    """The tokens ``r`` found cached: the server's count, or where it reports none (vLLM without
    ``--enable-prompt-tokens-details``, -1 in the trace) what the probe's phase made cached: its prefix for a
    ``cached-*`` repeat, nothing for the others. Counted as cold, a cached repeat would join the cold samples of
    its length and read as a spread of several hundred %."""
    if r.cached_tokens >= 0:
        return r.cached_tokens
    return r.prefix_length if r.phase.startswith("cached-") else 0


def repeat_floor(groups: Iterable[RepeatGroup]) -> float | None:
    """The spread over every request of ``groups`` (each group weighted by its requests), or None."""
    groups = list(groups)
    n = sum(g.requests for g in groups)
    return sum(g.spread * g.requests for g in groups) / n if n else None


def describe(groups: list[RepeatGroup]) -> str:
    """One line: the overall floor, then the cold groups' spread by prompt length."""
    floor = repeat_floor(groups)
    if floor is None:
        return "no identical requests sent alone"
    cold = ", ".join(f"{g.prompt_tokens}: {g.spread * 100:.1f} %" for g in groups if g.cached_tokens == 0)
    return (f"identical requests sent alone repeat their TTFT within {floor * 100:.1f} % (MAPE around their own "
            f"mean; cold prompts by length: {cold})")
