"""A block-counting KV port for scheduler unit tests (below the KV core: no prefix cache).

It answers the loop's four calls the way the real port does, with fixed per-request hits and load
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
    calls: list[tuple] = field(default_factory=list)

    @property
    def used(self) -> int:
        return sum(self.owned.values())

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def lookup(self, i: int, now: float) -> tuple[int, int]:
        return self.local_hits.get(i, 0), self.external_hits.get(i, 0)

    def admit(self, i: int, local: int, external: int, num_tokens: int, now: float) -> float:
        self.calls.append(("admit", i, local, external, num_tokens, now))
        if not self.grow(i, num_tokens, now):
            return -1.0
        self.external_hits.pop(i, None)  # a readmission after preemption finds nothing external
        return now + self.load_us.get(i, 0.0) if external else now

    def grow(self, i: int, num_tokens: int, now: float) -> bool:
        need = self._blocks(num_tokens) - self.owned.get(i, 0)
        if need > 0:
            if self.used + need > self.num_blocks:
                return False
            self.owned[i] = self.owned.get(i, 0) + need
        return True

    def free(self, i: int, preempted: bool) -> None:
        self.calls.append(("free", i, preempted))
        self.owned.pop(i, None)
