"""How steadily this machine runs fixed work on the lane model's core: the host's own timing noise floor.

The lane's TTFT gate judges each cell's TTFT MAPE against 15 %. On a shared VM the same work does not take the
same time twice: other tenants of the host take turns on the physical cores and caches, and the vCPU's speed
moves in stretches of seconds to minutes. A simulator, however exact, cannot predict that, so a cell's MAPE is
never below the host's own spread; the gate tells a simulator's error from the host's only when that spread is
well under the threshold. Measured on the 2-vCPU AMD EPYC VM of 2026-12-03, idle (load average 0.3): the same
float32 matmul work on core 0 took 52-78 ms, 7.6-8.6 % around its median, 2-s medians moving 54-66 ms, and the
lane server's identical 1,024-token prompts sent alone ran in two speeds, ~133 and ~180 ms, switching by the
second to the minute (docs/vllm-cpu-calibration.md, "The host runs the same work at two speeds").

:func:`measure` times a fixed piece of work (the lane model's MLP shapes, numpy, one thread) over and over on one
core, in a child process pinned there; :class:`NoiseReport` says what that gives: the **floor**, the mean over
samples of |sample - median| / sample (the MAPE a perfect model of this work would have), and the window medians.
The host is *quiet* enough for the gate when the floor is at most ``max_floor`` (default a third of the gate's
15 %). Run it before the lane server starts: the server's engine busy-polls a core.

    python tools/vllm_cpu.py host-noise                 # 30 s; exit 0 when quiet, 4 when not
    python tools/vllm_cpu.py host-noise --json out.json --seconds 60
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

#: the lane's TTFT MAPE threshold (scenarios/lane/vllm-cpu.blis.yaml), and the part of it the host may take
GATE_THRESHOLD = 0.15
DEFAULT_MAX_FLOOR = GATE_THRESHOLD / 3
DEFAULT_SECONDS = 30.0
WINDOW_S = 5.0

# The child: the lane model's MLP shapes (hidden 256, intermediate 768) over a 512-token batch, ~50 ms a sample
# on the EPYC VM; a short sleep between samples, as between a server's requests.
_CHILD = r"""
import json, sys, time
import numpy as np
seconds = float(sys.argv[1])
rng = np.random.default_rng(0)
x = rng.random((512, 256), dtype=np.float32)
w1 = rng.random((256, 768), dtype=np.float32)
w2 = rng.random((768, 256), dtype=np.float32)
out = []
start = time.perf_counter()
while time.perf_counter() - start < seconds:
    t = time.perf_counter()
    for _ in range(6):
        np.maximum(x @ w1, 0.0) @ w2
    out.append([t - start, (time.perf_counter() - t) * 1e3])
    time.sleep(0.02)
json.dump(out, sys.stdout)
"""


@dataclasses.dataclass(frozen=True)
class NoiseReport:
    """Fixed work timed ``len(samples_ms)`` times on ``core``: its spread (``floor``) against ``max_floor``."""

    core: int
    seconds: float
    samples_ms: tuple[float, ...]
    window_medians_ms: tuple[float, ...]
    floor: float
    max_floor: float

    @property
    def quiet(self) -> bool:
        return self.floor <= self.max_floor

    def describe(self) -> str:
        med = statistics.median(self.samples_ms)
        lo, hi = min(self.window_medians_ms), max(self.window_medians_ms)
        verdict = ("quiet enough for a 15 % TTFT gate" if self.quiet else
                   "too noisy for a 15 % TTFT gate: a perfect model of this work would be off by that much per "
                   "request, before any simulator error")
        return (f"core {self.core}, {len(self.samples_ms)} samples of fixed work over {self.seconds:g} s: median "
                f"{med:.1f} ms, {self.floor:.2%} around it (limit {self.max_floor:.2%}); {WINDOW_S:g}-s medians "
                f"{lo:.1f}-{hi:.1f} ms: {verdict}")

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "quiet": self.quiet, "summary": self.describe()}


def noise_floor(samples: Sequence[float]) -> float:
    """Mean over samples of |sample - median| / sample: the MAPE of predicting every sample by the median."""
    if not samples:
        raise ValueError("no samples")
    mid = statistics.median(samples)
    return sum(abs(s - mid) / s for s in samples) / len(samples)


def window_medians(times_s: Sequence[float], samples: Sequence[float], window_s: float = WINDOW_S) -> list[float]:
    """Medians of the samples in consecutive ``window_s`` windows (by start time); empty windows are left out."""
    buckets: dict[int, list[float]] = {}
    for t, s in zip(times_s, samples):
        buckets.setdefault(int(t // window_s), []).append(s)
    return [statistics.median(v) for _, v in sorted(buckets.items())]


def report(timed: Sequence[tuple[float, float]], *, core: int, seconds: float,
           max_floor: float = DEFAULT_MAX_FLOOR) -> NoiseReport:
    """The :class:`NoiseReport` of ``timed``: (start s, duration ms) per sample."""
    times = [t for t, _ in timed]
    samples = [ms for _, ms in timed]
    return NoiseReport(core=core, seconds=seconds, samples_ms=tuple(samples),
                       window_medians_ms=tuple(window_medians(times, samples)),
                       floor=noise_floor(samples), max_floor=max_floor)


def default_core() -> int:
    """The core the lane model's worker gets: vLLM's automatic binding takes the first one of a 2-core machine
    and leaves the rest to the frontend (tools/vllm_cpu_placement.py)."""
    return min(os.sched_getaffinity(0))


def measure(seconds: float = DEFAULT_SECONDS, core: int | None = None, *,
            max_floor: float = DEFAULT_MAX_FLOOR) -> NoiseReport:
    """Time the fixed work for ``seconds`` in a child process pinned to ``core`` with one BLAS thread."""
    core = default_core() if core is None else core
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(seconds)], env=env, capture_output=True, text=True,
                         check=False, timeout=seconds + 120, preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    if out.returncode != 0:
        raise RuntimeError(f"the timing child failed (exit {out.returncode}): {out.stderr.strip()[-400:]}")
    timed = [(float(t), float(ms)) for t, ms in json.loads(out.stdout)]
    if len(timed) < 2:
        raise RuntimeError(f"the timing child took {len(timed)} sample(s) in {seconds:g} s")
    return report(timed, core=core, seconds=seconds, max_floor=max_floor)
