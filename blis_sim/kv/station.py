"""Transfer stations: how long a tier's read or write job takes, and when it completes.

:class:`TransferStation` models one tier (docs/reference-formats.md §7.1) as two pools of servers:
``n_read_threads`` for reads (towards the GPU: CPU→GPU loads, fs→CPU promotions) and
``n_write_threads`` for writes (GPU→CPU stores, CPU→fs cascades), each pool FIFO. A job submitted
at ``t`` starts on the pool's earliest-free server at ``max(t, free)`` and takes

    svc = base_latency + bytes / (bandwidth · ramp(q)),  q = jobs of that pool in service at start + 1
    ramp(q) = f1 + (1 − f1)·(q − 1)/(Qsat − 1) for 1 ≤ q < Qsat, else 1   (off when Qsat < 2)
    svc ← svc · max(0.05, 1 + N(0, σ))   when latency_jitter_stddev σ > 0 (seeded, per tier)

``submit(read, nbytes, t)`` returns ``(done_time, service_time)``; completion times are fixed at
submission, so no event loop is needed. Departures from the reference: times are float µs (no
integer truncation), and a read server never takes a queued write (and vice versa) — the two pools
are independent FIFO queues.
"""
from __future__ import annotations

import numpy as np

from blis_sim.kv.config import TierStation


class TransferStation:
    """One tier's read and write server pools (see the module docstring)."""

    def __init__(self, cfg: TierStation, seed: int) -> None:
        self.cfg = cfg
        self._free = {True: [0.0] * cfg.n_read_threads, False: [0.0] * cfg.n_write_threads}
        self._rng = np.random.default_rng(seed) if cfg.latency_jitter_stddev > 0 else None
        qsat, f1 = cfg.saturation_queue_depth, cfg.single_transfer_fraction
        self._flat = qsat < 2 or f1 <= 0.0 or f1 >= 1.0  # _ramp(q) == 1.0 for every q

    def _ramp(self, q: int) -> float:
        qsat, f1 = self.cfg.saturation_queue_depth, self.cfg.single_transfer_fraction
        if qsat < 2 or f1 <= 0.0 or f1 >= 1.0 or q >= qsat:
            return 1.0
        return f1 + (1.0 - f1) * (q - 1) / (qsat - 1)

    def service_time(self, read: bool, nbytes: int, q: int) -> float:
        """Service time of one job entering service with ``q`` jobs (itself included) in service."""
        bw = self.cfg.read_bandwidth if read else self.cfg.write_bandwidth
        return self.cfg.base_latency + nbytes / (bw * self._ramp(q))

    def submit(self, read: bool, nbytes: int, t: float) -> tuple[float, float]:
        servers = self._free[read]
        free = min(servers)
        i = servers.index(free)  # the first earliest-free server
        start = t if t > free else free
        if self._flat:  # no ramp: the queue depth does not matter
            bw = self.cfg.read_bandwidth if read else self.cfg.write_bandwidth
            svc = self.cfg.base_latency + nbytes / (bw * 1.0)
        else:
            q = 1 + sum(1 for f in servers if f > start)
            svc = self.service_time(read, nbytes, q)
        if self._rng is not None:
            svc *= max(0.05, 1.0 + float(self._rng.normal(0.0, self.cfg.latency_jitter_stddev)))
        done = start + svc
        servers[i] = done
        return done, svc
