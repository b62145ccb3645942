"""The probe's workload: phases that identify every coefficient of the latency model on any server.

API::

    limits = ServerLimits(max_model_len=8192, block_size=16, num_gpu_blocks=4096, max_num_seqs=256)
    plan = probe_plan(limits, ProbeConfig(seed=7))      # a WorkloadPlan for observe()
    fitted_phases(plan)                                 # the phases a fit uses (all but the warm-up)

Phases, in the order they run (each a drained group, so "alone" means alone on the server):

``warmup-<k>``        two short requests outside the fitted window (a fresh server's first request pays
                      one-off costs: connections, lazy imports, allocator growth);
``cold-<L>-<k>``      unique prompts of an ``L``-token prefix + 32 tokens, ``L`` = 64, 128, 256, ... doubling,
                      then the longest the server takes, sent alone: per-step base, per-prefill-token and
                      attention terms. Three passes over the lengths, spread over the probe: the first here,
                      the second after the decode batches, the third at the very end (below), so that a slow
                      stretch of the host (seconds on a shared VM) meets one sample of a length, not all;
``seed-<L>``, ``cached-<L>-<k>``  one prompt whose prefix the next two repeat with new suffixes: what a
                      cached prefix saves against the per-request (frontend) time that stays; later, after
                      the decode batches, a third (``cached-<L>-2``) with 512 new tokens: a prefill whose
                      attention reads a long cached context (``k x L`` pairs), as a chat's next turn or a
                      cell's repeat does, which prompts sent cold (``k²/2`` pairs) do not show;
``decode-<B>``        ``B`` concurrent short prompts with long outputs, ``B`` = 1, 2, 4, ... up to
                      ``max_num_seqs`` (capped by the KV cache): closed-loop decode batches, the
                      per-decode-sequence term and where a step stops being flat;
``decode-<B>-ctx<P>`` the same with long prompts: the per-context-token (attention read) term;
``mixed-<B>-<L>``     ``B`` decoders, then two prompts of ``L`` tokens arriving while they decode: steps
                      that carry prefill and decode together; ``B`` = 4 and 32 (or as many as run
                      beside the two): those two find many requests in flight and none queued for
                      admission, which tells the frontend's two terms apart (a burst grows both);
``ramp-<N>``          ``N`` concurrent requests of one mix (512-token prompt, 64 output tokens; less where
                      N of them would fill more than half the GPU cache), ``N``
                      doubling from 2 up to ``ramp_max``: batched prefill and, at the top, the server's
                      maximum throughput (:func:`ramp_throughput` reads it per level);
``sustain-<N>``       only when the ramp goes past ``max_num_seqs`` (cells that queue requests at the server):
                      ``N`` = 3 x ``max_num_seqs`` short requests at once (prompts spread over 64-512 tokens,
                      outputs over 16-48), so that the server runs full for seconds with a queue, each
                      finish letting one waiting prompt in: the steps of a saturated server (a full decode
                      batch with one short prefill), which no drained batch of equal requests shows (they
                      finish together, and the next batch prefills together). With it, the fit replays the
                      ramp but does not fit its rows (:func:`replayed_only`);
``cold-<L>-2``        the third pass of cold prompts, last: the server as the cells after the probe meet it.

The longest prompt is ``min(max_model_len - output, GPU cache / 4, max_prompt)``: a quarter of the cache, so
the probe never evicts its own prefixes. Lengths double from 64, so the median probe prompt is about the square root
of 64 times the longest.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from blis_sim.defaults import DEFAULT_MAX_NUM_BATCHED_TOKENS
from blis_sim.errors import ConfigError
from blis_sim.workload import PhasePlan, PlannedRequest, WorkloadPlan

SUFFIX = 32                        # fresh tokens after each prefix
COLD_SAMPLES = 3                   # cold samples per length, one per pass (one hiccup is set aside)
CACHED_REPEATS = 2                 # cached TTFTs are short: two samples each
CACHED_LONG_SUFFIX = 512           # then one with 512 new tokens: a prefill attending to a long cached context
TTFT_OUTPUT = 4                    # TTFT requests: a few tokens, so they end quickly
DECODE_PROMPT, DECODE_OUTPUT = 64, 64
CONTEXT_BATCHES = (1, 16)          # decode batch sizes repeated with long prompts
MIXED_BATCHES = (4, 32)            # decoders under a mixed step (the top capped by the server)
MIXED_OUTPUT = 256                 # long enough to still decode when the prefills arrive
MIXED_ARRIVALS_US = (100_000, 300_000)
RAMP_PROMPT, RAMP_OUTPUT = 512, 64
SUSTAIN_BATCHES = 3                # the sustain phase: 3 x max_num_seqs requests, 2/3 of them queued at first
SUSTAIN_OUTPUT = (16, 48)          # its outputs, spread (a full batch then finishes one at a time)
MIN_LENGTH = 64
# the trace header's workload spec: the probe's requests come from the phases, not from a client
_PLACEHOLDER_SPEC = {"version": "2", "aggregate_rate": 1, "num_requests": 1,
                     "clients": [{"id": "probe", "rate_fraction": 1,
                                  "input_distribution": {"type": "constant", "params": {"value": 1}},
                                  "output_distribution": {"type": "constant", "params": {"value": 1}}}]}


@dataclass(frozen=True)
class ServerLimits:
    """What the probe sizes itself to (read from the server by :func:`blis_sim.probe.read_limits`)."""

    max_model_len: int
    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS

    def __post_init__(self) -> None:
        for name in ("max_model_len", "block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"must be > 0, got {getattr(self, name)}", field=name)

    @property
    def gpu_tokens(self) -> int:
        return self.block_size * self.num_gpu_blocks


@dataclass(frozen=True)
class ProbeConfig:
    """How big a probe to plan. ``max_prompt`` caps the longest prompt (0: the server's limit);
    ``ramp_max`` the largest ramp level (0: ``2 x max_num_seqs``, at most 256; below ``ramp_min``: no
    ramp, so ``ramp_max=1`` plans none); ``decode_max`` the largest decode batch (0: ``max_num_seqs``;
    the long-context and mixed batches stay within it); ``mixed`` the mixed phases; ``seed``/``tag``
    make every prompt unique to this probe."""

    seed: int = 7
    tag: str = "probe"
    max_prompt: int = 0
    ramp_max: int = 0
    decode_max: int = 0
    ramp_min: int = 2
    mixed: bool = True

    def __post_init__(self) -> None:
        for name in ("max_prompt", "ramp_max", "decode_max"):
            if getattr(self, name) < 0:
                raise ConfigError(f"must be >= 0, got {getattr(self, name)}", field=name)


def doubling(start: int, stop: int) -> list[int]:
    """start, 2 start, 4 start, ... below ``stop``, then ``stop`` itself (empty when stop < start)."""
    out: list[int] = []
    n = start
    while n < stop:
        out.append(n)
        n *= 2
    if stop >= start:
        out.append(stop)
    return out


def longest_prompt(limits: ServerLimits, config: ProbeConfig) -> int:
    cap = min(limits.max_model_len - SUFFIX - TTFT_OUTPUT, limits.gpu_tokens // 4)
    if config.max_prompt:
        cap = min(cap, config.max_prompt)
    cap -= cap % limits.block_size  # whole blocks
    if cap < MIN_LENGTH:
        raise ConfigError(f"the server takes prompts of at most {cap} tokens; the probe needs {MIN_LENGTH}",
                          field="max_model_len")
    return cap


def probe_lengths(limits: ServerLimits, config: ProbeConfig) -> list[int]:
    return doubling(MIN_LENGTH, longest_prompt(limits, config))


def decode_batches(limits: ServerLimits, config: ProbeConfig) -> list[int]:
    """1, 2, 4, ... up to max_num_seqs (or ``decode_max``), while the batch fits half the cache."""
    top = min(config.decode_max or limits.max_num_seqs, limits.max_num_seqs,
              limits.gpu_tokens // 2 // (DECODE_PROMPT + DECODE_OUTPUT))
    return doubling(1, max(top, 1))


def mixed_batches(limits: ServerLimits, batches: list[int]) -> list[int]:
    """Decoders of the mixed phases: ``MIXED_BATCHES``, the largest capped at what the server runs
    beside the two arrivals and at the largest decode batch (the cache), so that a server of 32
    sequences still gets one with ~30 requests in flight."""
    top = min(MIXED_BATCHES[-1], limits.max_num_seqs - 2, batches[-1])
    return sorted({b for b in MIXED_BATCHES[:-1] if b <= top} | ({top} if top >= 1 else set()))


def ramp_levels(limits: ServerLimits, config: ProbeConfig) -> list[int]:
    """``ramp_min``, doubling, up to ``ramp_max`` (default 2 x max_num_seqs, at most 256, within the cache).
    Never past 2 x max_num_seqs: beyond, the server runs as many and queues the rest, which a higher level
    only lengthens (cells that send hundreds at once get the sustain phase for it instead)."""
    top = min(config.ramp_max, 2 * limits.max_num_seqs) if config.ramp_max else min(2 * limits.max_num_seqs, 256)
    return doubling(config.ramp_min, top) if top >= config.ramp_min else []


def ramp_request(limits: ServerLimits, config: ProbeConfig, level: int) -> tuple[int, int]:
    """(prompt, output) of a ramp request: 512 + 64 tokens, less where ``level`` of them would fill
    more than half the cache (a ramp that preempted itself would measure recomputation, not throughput)."""
    share = limits.gpu_tokens // 2 // level
    output = max(4, min(RAMP_OUTPUT, share // 4))
    return max(16, min(RAMP_PROMPT, longest_prompt(limits, config), share - output)), output


def spread(low: int, high: int, count: int) -> list[int]:
    """``count`` integers spread evenly over ``[low, high]``."""
    if count <= 1:
        return [(low + high) // 2] * count
    return [low + ((high - low) * k) // (count - 1) for k in range(count)]


def interleave(values: list[int], stride: int) -> list[int]:
    """``values`` taken ``stride`` apart, wrapping (a permutation: the stride is raised to the next
    coprime with their count), so that any run of consecutive ones spans their range."""
    n = len(values)
    while n > 1 and math.gcd(stride, n) != 1:
        stride += 1
    return [values[(k * stride) % n] for k in range(n)] if n else []


def sustain_requests(limits: ServerLimits, config: ProbeConfig) -> list[tuple[int, int]]:
    """(prompt, output) of the sustain phase's requests, or none when the ramp stays within
    ``max_num_seqs`` (nothing queues at the server there). Prompts and outputs are interleaved at two
    strides, so the first batch the server runs and each later admission mix lengths; the phase is
    capped at 256 requests and at half the cache."""
    levels = ramp_levels(limits, config)
    if not levels or levels[-1] <= limits.max_num_seqs:
        return []
    top = min(RAMP_PROMPT, longest_prompt(limits, config))
    count = min(SUSTAIN_BATCHES * limits.max_num_seqs, 256,
                limits.gpu_tokens // 2 // (top + SUSTAIN_OUTPUT[1]))
    if count <= limits.max_num_seqs:
        return []
    # strides near a half and a third of the count: neighbours differ widely, and the two do not move together
    prompts = interleave(spread(min(MIN_LENGTH, top), top, count), count // 2 - 1)
    outputs = interleave(spread(*SUSTAIN_OUTPUT, count), count // 3 + 1)
    return list(zip(prompts, outputs))


class _Builder:
    """Appends drained phases to a plan."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.phases: list[PhasePlan] = []

    def add(self, name: str, reqs: list[dict[str, Any]]) -> None:
        index = len(self.phases)
        planned = tuple(PlannedRequest(uid=f"{index}.{n}", phase=name, phase_index=index, client_id="probe",
                                       streaming=True, **{"arrival_us": 0, **r}) for n, r in enumerate(reqs))
        self.phases.append(PhasePlan(index=index, name=name, seed=self.seed, gap_us=0, horizon_us=0,
                                     num_requests=len(planned), requests=planned))


def unique(length: int, output: int, **extra: Any) -> dict[str, Any]:
    return {"input_tokens": length, "output_tokens": output, **extra}


def probe_plan(limits: ServerLimits, config: ProbeConfig = ProbeConfig()) -> WorkloadPlan:
    """The probe's phases (module docstring), sized to ``limits``."""
    from blis_sim.formats.workload import WorkloadSpec

    b = _Builder(config.seed)
    tag = f"{config.tag}{config.seed:x}"
    for k in range(2):
        b.add(f"warmup-{k}", [unique(MIN_LENGTH, TTFT_OUTPUT)])
    lengths = probe_lengths(limits, config)
    groups = [{"prefix_group": f"{tag}-{n}", "prefix_length": length, "input_tokens": length + SUFFIX,
               "new_input_tokens": SUFFIX, "output_tokens": TTFT_OUTPUT} for n, length in enumerate(lengths)]

    def cold(n: int, k: int) -> None:  # a unique prefix: each cold sample misses
        b.add(f"cold-{lengths[n]}-{k}", [{**groups[n], "prefix_group": f"{tag}-{n}-cold{k}"}])

    def cold_pass(k: int) -> None:
        for n in range(len(lengths)):
            cold(n, k)

    # A slow stretch of a shared host lasts seconds: samples of one length sent back to back all meet it,
    # and the fit prices that length (and the cells after the probe) by it; a pass each at the start, in
    # the middle and at the end meets it once. The first pass runs beside the seeds.
    extended: list[tuple[str, list[dict[str, Any]]]] = []
    for n, (length, group) in enumerate(zip(lengths, groups)):
        cold(n, 0)
        b.add(f"seed-{length}", [group])
        for k in range(CACHED_REPEATS):
            b.add(f"cached-{length}-{k}", [group])
        # within the model's length and, like every probe prompt, a quarter of the cache
        extend = min(CACHED_LONG_SUFFIX, limits.max_model_len - length - TTFT_OUTPUT, limits.gpu_tokens // 4 - length)
        if extend > SUFFIX:
            extended.append((f"cached-{length}-{CACHED_REPEATS}",
                             [{**group, "input_tokens": length + extend, "new_input_tokens": extend}]))
    batches = decode_batches(limits, config)
    for batch in batches:
        b.add(f"decode-{batch}", [unique(DECODE_PROMPT, DECODE_OUTPUT) for _ in range(batch)])
    # after other work, as a chat's next turn meets its context: not straight after the same prefix's last use,
    # when its KV is still in the CPU's caches (on a CPU server that prices the prefill's attention low)
    for name, reqs in extended:
        b.add(name, reqs)
    # after the seeded prefixes' last use: the unique prompts may push them out of a small cache
    for k in range(1, COLD_SAMPLES - 1):
        cold_pass(k)
    context = min(2048, lengths[-1])
    for batch in CONTEXT_BATCHES:
        if batch <= batches[-1] and batch * (context + DECODE_OUTPUT) <= limits.gpu_tokens // 2:
            b.add(f"decode-{batch}-ctx{context}", [unique(context, DECODE_OUTPUT) for _ in range(batch)])
    for batch in mixed_batches(limits, batches) if config.mixed else ():
        for length in sorted({lengths[len(lengths) // 2], lengths[-1]}):
            reqs = [unique(DECODE_PROMPT, MIXED_OUTPUT) for _ in range(batch)]
            reqs += [unique(length, TTFT_OUTPUT, arrival_us=t) for t in MIXED_ARRIVALS_US]
            b.add(f"mixed-{batch}-{length}", reqs)
    for level in ramp_levels(limits, config):
        prompt, output = ramp_request(limits, config, level)
        b.add(f"ramp-{level}", [unique(prompt, output) for _ in range(level)])
    sustain = sustain_requests(limits, config)
    if sustain:
        b.add(f"sustain-{len(sustain)}", [unique(prompt, output) for prompt, output in sustain])
    cold_pass(COLD_SAMPLES - 1)
    spec = WorkloadSpec.model_validate({**_PLACEHOLDER_SPEC, "seed": config.seed})
    return WorkloadPlan(seed=config.seed, spec=spec, phases=tuple(b.phases))


def fitted_phases(plan: WorkloadPlan) -> tuple[str, ...]:
    """The phases the fit uses: all but the warm-up."""
    return tuple(p.name for p in plan.phases if not p.name.startswith("warmup"))


def replayed_only(phases: Iterable[str]) -> frozenset[str]:
    """The phases of a trace that a fit replays but does not fit: in a probe trace with a ``sustain`` phase,
    its ``ramp`` phases. Their drained batches of equal requests prefill together and finish together, steps
    that a server with a queue never runs; the linear model cannot price both those and the sustained steps
    (a full decode batch with one short prefill) on one set of coefficients, and fitted on both it predicted
    a saturated server 6-7 % faster than it was (on the lane, against 1.4-2 % without the ramp's rows). The
    ramp still runs: it warms the batch sizes, and :func:`blis_sim.probe.ramp_throughput` reads it. Empty
    for any other trace."""
    names = set(phases)
    if not is_probe_trace(names) or not any(n.startswith("sustain-") for n in names):
        return frozenset()
    return frozenset(n for n in names if n.startswith("ramp-"))


#: The phases that send one request at a time, each alone on the server.
_ONE_AT_A_TIME = re.compile(r"cold-\d+-\d+|seed-\d+|cached-\d+-\d+|decode-1(-ctx\d+)?")


def one_at_a_time(phases: Iterable[str]) -> frozenset[str]:
    """The phases of a probe trace that send one request at a time (cold, seed and cached prompts, the
    single decodes): what a cell that sends one request at a time meets. A fit on the whole probe prices
    them and the batched phases on one set of coefficients, a compromise between two regimes whose time
    outside the engine's steps differs; on the lane's CPU vLLM it put 4096-token prompts sent alone 8-19 %
    short in two CI runs of five, where the fit on these phases alone kept every sequential cell within
    11 % over ten runs (docs/vllm-cpu-calibration.md). Empty for a trace that is not a probe's."""
    names = set(phases)
    if not is_probe_trace(names):
        return frozenset()
    return frozenset(n for n in names if _ONE_AT_A_TIME.fullmatch(n))


#: The names :func:`probe_plan` gives its phases.
_PHASE_NAME = re.compile(r"warmup-\d+|cold-\d+-\d+|seed-\d+|cached-\d+-\d+|decode-\d+(-ctx\d+)?"
                         r"|mixed-\d+-\d+|ramp-\d+|sustain-\d+")


def is_probe_trace(phases: Iterable[str]) -> bool:
    """Whether a trace's per-request phase names are all the probe's (with or without its ramp: the
    plugin's probe for sequential cells has none)."""
    names = set(phases)
    return bool(names) and all(_PHASE_NAME.fullmatch(n) for n in names)


def max_in_flight(plan: WorkloadPlan) -> int:
    """The largest phase: the client's concurrency cap must let a whole phase in at once."""
    return max((len(p.requests) for p in plan.phases), default=1)
