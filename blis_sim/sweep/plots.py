"""Plots of a sweep (matplotlib, the ``[plot]`` extra): one figure per axis, one panel per chosen
metric, the metric against the axis's values, one line per combination of the other axes; and the
curve of a capacity search with its threshold and answer.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

PLOT_EXTRA = "pip install 'pytest-blis[plot]' (matplotlib)"


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: smaller SVGs
    matplotlib.rcParams["svg.hashsalt"] = "blis"   # stable ids: the same sweep, the same file
    import matplotlib.pyplot as plt

    return plt


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def axis_plots(rows: list[dict[str, Any]], axes: list[Any], metrics: Sequence[str], out_dir: Path,
               fmt: str = "png") -> list[Path]:
    """``plot-<axis>.<fmt>`` per axis; ``axes`` are :class:`~blis_sim.sweep.spec.Axis` (values as
    read give the x position, values as written label it)."""
    plt = _pyplot()
    written = []
    for axis in axes:
        others = [a for a in axes if a is not axis]
        xs_read = list(axis.values)
        numeric = _numeric(xs_read)
        position = {repr(r): (v if numeric else i) for i, (v, r) in enumerate(zip(xs_read, axis.raw))}
        # sizes and rates are usually swept geometrically: a log axis keeps the points apart
        log = numeric and min(xs_read) > 0 and max(xs_read) / min(xs_read) >= 16
        fig, panels = plt.subplots(len(metrics), 1, figsize=(6.4, 2.6 * len(metrics)), squeeze=False)
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(tuple(r[o.name] for o in others), []).append(r)
        for (ax,), metric in zip(panels, metrics):
            for combo, members in groups.items():
                pts = sorted(((position[repr(m[axis.name])], m.get(metric)) for m in members),
                             key=lambda p: p[0])
                label = ", ".join(f"{o.name}={v}" for o, v in zip(others, combo)) or None
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
            ax.set_ylabel(metric)
            ax.grid(True, alpha=0.3)
            if log:
                ax.set_xscale("log", base=2)
                ax.minorticks_off()
            ax.set_xticks([position[repr(r)] for r in axis.raw], [str(r) for r in axis.raw],
                          rotation=30 if len(axis.raw) > 6 else 0)
            if others and len(groups) <= 8:
                ax.legend(fontsize="x-small")
        panels[-1][0].set_xlabel(axis.name)
        fig.tight_layout()
        path = out_dir / f"plot-{axis.name}.{fmt}"
        fig.savefig(path, **({"metadata": {"Date": None}} if fmt == "svg" else {}))
        plt.close(fig)
        written.append(path)
    return written


def curve_plot(points: Sequence[tuple[float, float]], *, axis: str, metric: str, threshold: float,
               answer: float | None, path: Path) -> Path:
    """A capacity search's evaluated points, its threshold and its answer."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    pts = sorted(points)
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label="evaluated")
    ax.axhline(threshold, color="tab:red", linestyle="--", label=f"target {threshold:g}")
    if answer is not None:
        ax.axvline(answer, color="tab:green", linestyle=":", label=f"answer {answer:g}")
    ax.set_xlabel(axis)
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, **({"metadata": {"Date": None}} if path.suffix == ".svg" else {}))
    plt.close(fig)
    return path
