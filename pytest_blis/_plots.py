"""Hand-written SVG plots for a calibration cell (no plotting dependency).

API::

    ttft_cdf_svg(real_us, sim_us, title) -> str      # two empirical CDFs, TTFT in ms on x
    hit_rates_svg(rows, title) -> str                # rows: (label, real, sim) as fractions; paired bars
    ttft_scatter_svg(real_us, sim_us, title, band)   # per request: real TTFT (x) vs simulated (y), ms

Each returns a complete, self-contained SVG document (Allure shows it inline; a browser opens it as a
file). Values are drawn as given: an empty input draws the axes and a "no data" note.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from xml.sax.saxutils import escape

REAL_COLOUR, SIM_COLOUR = "#1f77b4", "#d62728"
_FONT = 'font-family="sans-serif" font-size="12"'


def _nice_step(span: float, ticks: int = 5) -> float:
    """A 1/2/5 × 10^k step giving about ``ticks`` intervals over ``span``."""
    raw = span / max(ticks, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _doc(width: int, height: int, title: str, body: list[str]) -> str:
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">')
    return "\n".join([head, f'<rect width="{width}" height="{height}" fill="white"/>',
                      f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" {_FONT} font-weight="bold">'
                      f'{escape(title)}</text>', *body, "</svg>", ""])


def _legend(x: float, y: float) -> list[str]:
    out = []
    for k, (name, colour) in enumerate((("real", REAL_COLOUR), ("sim", SIM_COLOUR))):
        yy = y + 16 * k
        out.append(f'<rect x="{x:.0f}" y="{yy - 9:.0f}" width="12" height="10" fill="{colour}"/>')
        out.append(f'<text x="{x + 16:.0f}" y="{yy:.0f}" {_FONT}>{name}</text>')
    return out


def ttft_cdf_svg(real_us: Sequence[float], sim_us: Sequence[float], title: str) -> str:
    """Empirical CDFs of real and simulated TTFT (ms on the x axis, fraction of requests on y)."""
    width, height, left, right, top, bottom = 560, 340, 60, 20, 36, 50
    pw, ph = width - left - right, height - top - bottom
    values = [v / 1000 for v in (*real_us, *sim_us) if math.isfinite(v)]
    body = [f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    if not values:
        body.append(f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" {_FONT}>no data</text>')
        return _doc(width, height, title, body)
    hi = max(values) * 1.05 or 1.0
    step = _nice_step(hi)
    hi = math.ceil(hi / step) * step

    def px(ms: float) -> float:
        return left + pw * ms / hi

    def py(frac: float) -> float:
        return top + ph * (1 - frac)

    tick = 0.0
    while tick <= hi + 1e-9:
        tx = f"{px(tick):.1f}"
        body.append(f'<line x1="{tx}" y1="{top + ph}" x2="{tx}" y2="{top + ph + 4}" stroke="#999"/>')
        body.append(f'<text x="{px(tick):.1f}" y="{top + ph + 17}" text-anchor="middle" {_FONT}>{tick:g}</text>')
        tick += step
    for frac in (0, 0.25, 0.5, 0.75, 1):
        body.append(f'<line x1="{left}" y1="{py(frac):.1f}" x2="{left + pw}" y2="{py(frac):.1f}" stroke="#eee"/>')
        body.append(f'<text x="{left - 6}" y="{py(frac) + 4:.1f}" text-anchor="end" {_FONT}>{frac:g}</text>')
    body.append(f'<text x="{left + pw / 2}" y="{height - 10}" text-anchor="middle" {_FONT}>TTFT (ms)</text>')
    body.append(f'<text x="14" y="{top + ph / 2}" text-anchor="middle" {_FONT} '
                f'transform="rotate(-90 14 {top + ph / 2})">fraction of requests</text>')
    for series, colour in ((real_us, REAL_COLOUR), (sim_us, SIM_COLOUR)):
        xs = sorted(v / 1000 for v in series if math.isfinite(v))
        if not xs:
            continue
        points = [(px(0), py(0))]
        for i, x in enumerate(xs):  # a step function: up at each sample
            points += [(px(x), py(i / len(xs))), (px(x), py((i + 1) / len(xs)))]
        points.append((px(hi), py(1)))
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
    body += _legend(left + 10, top + 16)
    return _doc(width, height, title, body)


def hit_rates_svg(rows: Sequence[tuple[str, float, float]], title: str) -> str:
    """Paired horizontal bars, real above sim, one pair per hit-rate definition/tier (0-100 %)."""
    label_w, bar_w, right, top = 230, 300, 70, 36
    pair_h = 30
    width = label_w + bar_w + right
    height = top + max(len(rows), 1) * pair_h + 40
    body = [f'<line x1="{label_w}" y1="{top - 4}" x2="{label_w}" y2="{height - 34}" stroke="#999"/>']
    for pct in (0, 25, 50, 75, 100):
        x = label_w + bar_w * pct / 100
        body.append(f'<text x="{x:.0f}" y="{height - 18}" text-anchor="middle" {_FONT}>{pct}%</text>')
        body.append(f'<line x1="{x:.0f}" y1="{top - 4}" x2="{x:.0f}" y2="{height - 34}" stroke="#eee"/>')
    if not rows:
        body.append(f'<text x="{label_w + bar_w / 2}" y="{top + 14}" text-anchor="middle" {_FONT}>no data</text>')
    for k, (label, real, sim) in enumerate(rows):
        y = top + k * pair_h
        body.append(f'<text x="{label_w - 6}" y="{y + 16}" text-anchor="end" {_FONT}>{escape(label)}</text>')
        for j, (value, colour) in enumerate(((real, REAL_COLOUR), (sim, SIM_COLOUR))):
            v = min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0
            yy = y + 3 + 12 * j
            body.append(f'<rect x="{label_w}" y="{yy}" width="{bar_w * v:.1f}" height="11" fill="{colour}"/>')
            body.append(f'<text x="{label_w + bar_w * v + 4:.1f}" y="{yy + 10}" {_FONT}>{value * 100:.1f}%</text>')
    body += _legend(10, 16)
    return _doc(width, height, title, body)


def ttft_scatter_svg(real_us: Sequence[float], sim_us: Sequence[float], title: str,
                     band: float | None = None) -> str:
    """Per-request TTFT, real (x) against simulated (y), in ms: the diagonal is a perfect model;
    ``band`` (a fraction, e.g. the cell's MAPE threshold) draws the ±band lines around it."""
    width, height, left, right, top, bottom = 420, 400, 60, 20, 36, 50
    pw, ph = width - left - right, height - top - bottom
    pairs = [(r / 1000, s / 1000) for r, s in zip(real_us, sim_us) if math.isfinite(r) and math.isfinite(s)]
    body = [f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    if not pairs:
        body.append(f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" {_FONT}>no data</text>')
        return _doc(width, height, title, body)
    hi = max(max(p) for p in pairs) * 1.05 or 1.0
    step = _nice_step(hi)
    hi = math.ceil(hi / step) * step

    def px(ms: float) -> float:
        return left + pw * ms / hi

    def py(ms: float) -> float:
        return top + ph * (1 - ms / hi)

    tick = 0.0
    while tick <= hi + 1e-9:
        body.append(f'<text x="{px(tick):.1f}" y="{top + ph + 17}" text-anchor="middle" {_FONT}>{tick:g}</text>')
        body.append(f'<text x="{left - 6}" y="{py(tick) + 4:.1f}" text-anchor="end" {_FONT}>{tick:g}</text>')
        body.append(f'<line x1="{left}" y1="{py(tick):.1f}" x2="{left + pw}" y2="{py(tick):.1f}" stroke="#eee"/>')
        tick += step
    body.append(f'<line x1="{px(0):.1f}" y1="{py(0):.1f}" x2="{px(hi):.1f}" y2="{py(hi):.1f}" stroke="#999"/>')
    for factor in ((1 - band, 1 + band) if band else ()):
        end = min(hi, hi * factor)  # the line y = factor * x, clipped to the plot
        body.append(f'<line x1="{px(0):.1f}" y1="{py(0):.1f}" x2="{px(end / factor):.1f}" y2="{py(end):.1f}" '
                    f'stroke="#bbb" stroke-dasharray="4 3"/>')
    for r, s in pairs:
        body.append(f'<circle cx="{px(r):.1f}" cy="{py(s):.1f}" r="3.5" fill="{SIM_COLOUR}" fill-opacity="0.7"/>')
    body.append(f'<text x="{left + pw / 2}" y="{height - 10}" text-anchor="middle" {_FONT}>real TTFT (ms)</text>')
    body.append(f'<text x="14" y="{top + ph / 2}" text-anchor="middle" {_FONT} '
                f'transform="rotate(-90 14 {top + ph / 2})">simulated TTFT (ms)</text>')
    if band:
        body.append(f'<text x="{left + 8}" y="{top + 16}" {_FONT}>dashed: ±{band * 100:g} %</text>')
    return _doc(width, height, title, body)
