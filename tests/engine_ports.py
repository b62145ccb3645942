"""A block-counting KV port for scheduler unit tests (below the KV core: no prefix cache).

It answers the loop's calls (see blis_sim.engine.kvport) with fixed per-request hits and load
times, so scheduler rules can be checked by hand.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CountingPort:
    num_blocks: int
    block_size: int = 16
    local_hits: dict[int, int] = field(default_factory=dict)
    external_hits: dict[int, int] = field(default_factory=dict)
    load_us: dict[int, float] = field(default_factory=dict)
    owned: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    calls: list[tuple] = field(default_factory=list)

    @property
    def used(self) -> int:
        return sum(self.owned.values())

    def _fit(self, i: int, tokens: int) -> bool:
        need = -(-tokens // self.block_size) - self.owned.get(i, 0)
        if need > 0:
            if self.used + need > self.num_blocks:
                return False
            self.owned[i] = self.owned.get(i, 0) + need
        self.end[i] = tokens
        return True

    def lookup(self, i: int, now: float) -> tuple[int, int]:
        return self.local_hits.get(i, 0), self.external_hits.get(i, 0)

    def admit(self, i: int, num_new_tokens: int, now: float):
        local, ext = self.lookup(i, now)
        self.calls.append(("admit", i, num_new_tokens, now))
        if not self._fit(i, local + ext + num_new_tokens):
            return None
        self.external_hits.pop(i, None)  # a readmission after preemption finds nothing external
        return (local + ext, now + self.load_us.get(i, 0.0) if ext else now)

    def grow(self, i: int, num_new_tokens: int) -> bool:
        return self._fit(i, self.end.get(i, 0) + num_new_tokens)

    def computed(self, i: int, now: float) -> None:
        self.calls.append(("computed", i, now))

    def preempt(self, i: int) -> None:
        self.calls.append(("preempt", i))
        self.owned.pop(i, None)
        self.end.pop(i, None)

    def finish(self, i: int) -> None:
        self.calls.append(("finish", i))
        self.owned.pop(i, None)
        self.end.pop(i, None)
