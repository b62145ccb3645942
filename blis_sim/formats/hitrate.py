"""One per-definition KV hit-rate (design D2), the same shape on both sides of a calibration.

Observed side: ``TraceHeader.pytest_blis.kv_hit_rates`` (from the server's counters over the window).
Simulated side: ``MetricsOutput.kv_hit_rates`` (computed by the simulator for the same definition).

``KVHitRate(definition, tier, unit, hits, queries, hit_rate, metric)``:

- ``definition``: ``prefix_cache`` | ``external`` | ``by_source`` | ``tiered`` | ``gpu_prefix_cache`` (legacy).
- ``tier``: ``None`` for prefix_cache / external / gpu_prefix_cache; the source (``device``, ``host``,
  ``disk``, ...) for ``by_source`` (required); the tier label (``0:primary``, ``1:fs``, ...) for ``tiered``,
  or ``None`` for the sum over tiers (the reference's aggregate).
- ``unit``: ``chunks`` for ``tiered`` (per-chunk lookups), ``tokens`` for every other definition.
- ``hits`` / ``queries``: non-negative integers, ``hits <= queries``; ``hit_rate`` in [0, 1].
  For ``by_source``, hits = cached tokens from that source, queries = prompt tokens queried.
- ``metric``: the metric name seen on the server (observed side), ``None`` on the simulated side.

Entries compare only when (definition, tier) are equal: :meth:`KVHitRate.key`.
"""

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from blis_sim.formats._model import StrictModel

Definition = Literal["prefix_cache", "external", "by_source", "tiered", "gpu_prefix_cache"]
DEFINITIONS: tuple[str, ...] = ("prefix_cache", "external", "by_source", "tiered", "gpu_prefix_cache")
# The primary (CPU) tier's label: vLLM's own for its tiering counters, and the one observe records the
# connector's unlabelled GPU <-> CPU counters under (vLLM's rule: docs/vllm-semantics.md §4).
PRIMARY_TIER = "0:primary"


class KVHitRate(StrictModel):
    definition: Definition
    tier: str | None = None
    unit: Literal["tokens", "chunks"]
    hits: int = Field(ge=0)
    queries: int = Field(ge=0)
    hit_rate: float = Field(ge=0.0, le=1.0)
    metric: str | None = None

    _keep_none: ClassVar[frozenset[str]] = frozenset({"tier", "metric"})

    @model_validator(mode="after")
    def _consistent(self) -> "KVHitRate":
        if self.hits > self.queries:
            raise ValueError(f"hits ({self.hits}) exceed queries ({self.queries})")
        expected = "chunks" if self.definition == "tiered" else "tokens"
        if self.unit != expected:
            raise ValueError(f"definition '{self.definition}' counts {expected}, got unit '{self.unit}'")
        if self.definition == "by_source" and not self.tier:
            raise ValueError("definition 'by_source' needs a tier (the source: device, host, disk, ...)")
        if self.definition in ("prefix_cache", "external", "gpu_prefix_cache") and self.tier is not None:
            raise ValueError(f"definition '{self.definition}' has no tier, got '{self.tier}'")
        return self

    def key(self) -> tuple[str, str | None]:
        """What must match for two entries to be compared."""
        return (self.definition, self.tier)
