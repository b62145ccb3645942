"""Scraping `/metrics` over HTTP and the counter window around the measured phases.

API::

    scraper = Scraper(session, "http://h/metrics", api_key="", timeout_s=300)
    snap = await scraper.snapshot()          # Snapshot, or ScrapeError naming the URL
    geometry = await scraper.geometry()      # {"block_size", "num_gpu_blocks"} or None, never raises

    window = CounterWindow(scraper, clock, settle_s=1.0, vllm_commit="", model="m", warn=run.warn,
                           sleep=run.sleep)
    await window.open()                      # settle, start scrape
    ...                                      # the measured phases
    await window.close()                     # settle, end scrape, derive every definition
    window.result, window.info, window.geometry

A miss (scrape failure, no counters, zero queries, reset) goes through ``warn`` with the reference's
wording and leaves ``result.observed`` empty; nothing here raises past the window.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aiohttp

from blis_sim.errors import ScrapeError
from blis_sim.formats.trace import ScrapeInfo
from blis_sim.observe.metrics import KvWindow, Snapshot, derive_window, kv_geometry, parse_exposition, summarize
from blis_sim.observe.records import RunClock

log = logging.getLogger("blis_sim.observe")


class Scraper:
    """``GET`` one metrics URL with the run's bearer key and timeout."""

    def __init__(self, session: aiohttp.ClientSession, url: str, *, api_key: str = "",
                 timeout_s: float = 300.0) -> None:
        self.session, self.url, self.timeout_s = session, url, timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def snapshot(self) -> Snapshot:
        try:
            async with self.session.get(self.url, headers=self.headers,
                                        timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                if r.status != 200:
                    raise ScrapeError(f"GET: HTTP {r.status}", url=self.url)
                text = await r.text(errors="replace")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise ScrapeError(f"GET: {type(exc).__name__}: {exc}", url=self.url) from None
        return parse_exposition(text, url=self.url)

    async def geometry(self) -> dict[str, int] | None:
        try:
            return kv_geometry(await self.snapshot())
        except ScrapeError as exc:
            log.info("observe: no KV geometry (%s)", exc)
            return None


class CounterWindow:
    """Start and end scrapes (each after a settle delay) and what they yield."""

    def __init__(self, scraper: Scraper, clock: RunClock, *, settle_s: float, vllm_commit: str, model: str,
                 warn: Callable[[str], None], sleep: Callable[[float], Awaitable[None]]) -> None:
        self.scraper, self.clock = scraper, clock
        self.settle_s, self.vllm_commit, self.model = settle_s, vllm_commit, model
        self.warn, self.sleep = warn, sleep
        self.start: Snapshot | None = None
        self.result: KvWindow | None = None
        self.info: ScrapeInfo | None = None
        self.geometry: dict[str, int] | None = None

    @property
    def opened(self) -> bool:
        return self.start is not None

    def _now_us(self) -> int:
        return self.clock.epoch_us(self.clock.now_ns())

    async def open(self) -> None:
        await self.sleep(self.settle_s)  # let the counters of earlier traffic land first
        t = self._now_us()
        self.info = ScrapeInfo(metrics_url=self.scraper.url, start_time_us=t, settle_s=self.settle_s)
        try:
            self.start = await self.scraper.snapshot()
        except ScrapeError as exc:
            self.warn(f"--scrape-kv-metrics: start-of-window /metrics scrape failed: {exc}; the observed KV "
                      "hit-rate will be omitted from the trace header")
            self.info = self.info.model_copy(update={"warnings": [str(exc)]})
            return
        self.geometry = kv_geometry(self.start)

    async def close(self) -> None:
        if self.start is None:
            return  # the start scrape failed: already reported
        await self.sleep(self.settle_s)
        info = (self.info or ScrapeInfo(metrics_url=self.scraper.url)).model_copy(
            update={"end_time_us": self._now_us()})
        try:
            end = await self.scraper.snapshot()
        except ScrapeError as exc:
            self.warn(f"--scrape-kv-metrics: end-of-window /metrics scrape failed: {exc}; omitting observed KV "
                      "hit-rate from the trace header")
            self.info = info.model_copy(update={"warnings": [str(exc)]})
            self.result = KvWindow(miss_reason=str(exc))
            return
        window = derive_window(self.start, end, vllm_commit=self.vllm_commit, model=self.model)
        self.geometry = kv_geometry(end) or self.geometry
        notes = list(window.notes)
        if window.observed is None:
            self.warn(f"--scrape-kv-metrics: {window.miss_reason}; omitting observed KV hit-rate from the trace "
                      "header")
            notes.insert(0, window.miss_reason)
        else:
            o = window.observed
            log.info("observe: observed KV hit-rate = %.4f (source=%s, block_hits=%d, block_queries=%d)",
                     o["hit_rate"], o["source"], o["block_hits"], o["block_queries"])
        if window.hit_rates:
            log.info("observe: KV hit-rates: %s", summarize(window.hit_rates))
        families = sorted({family_of(n) for n in end.samples if n.startswith("vllm:") and not n.endswith("_created")})
        self.info = info.model_copy(update={"families": families, "warnings": notes})
        self.result = window


def family_of(sample_name: str) -> str:
    """The family a sample belongs to (counter ``_total``, histogram parts stripped)."""
    for suffix in ("_total", "_bucket", "_count", "_sum"):
        if sample_name.endswith(suffix):
            return sample_name[: -len(suffix)]
    return sample_name
