"""The sweep file: which axes to vary, as a grid or a zip, and what to plot. Strict like every input
(unknown or duplicate keys, wrong types: one error naming file, line and field)::

    mode: grid                        # grid: every combination (first axis slowest) | zip: in step
    axes:
      kv_offload.cpu_bytes_to_use: [512MiB, 1GiB, 2GiB, 4GiB]
      total_kv_blocks: [500, 1000]
    plot:                             # optional
      metrics: [hit_rate.external, ttft_p99_ms]
      format: png                     # png | svg

``load_sweep_file(path, base_kind)`` reads and checks it (axis names against the base: a trace or a
workload spec; every value read) and returns a :class:`SweepSpec`; ``SweepSpec.points()`` the
points in order, each ``{axis: value}``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from blis_sim.errors import FormatError
from blis_sim.formats._strict import YamlDoc, load_yaml, parse_yaml, validate
from blis_sim.sweep.axes import AxisKind, axis_kind

DEFAULT_METRICS = ("hit_rate.prefix_cache", "ttft_p99_ms", "e2e_p99_ms")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlotSpec(_Strict):
    metrics: list[str] = Field(default_factory=lambda: list(DEFAULT_METRICS), min_length=1)
    format: Literal["png", "svg"] = "png"


class SweepFile(_Strict):
    mode: Literal["grid", "zip"] = "grid"
    axes: dict[str, list[Any]] = Field(min_length=1)
    plot: PlotSpec = Field(default_factory=PlotSpec)


@dataclass(frozen=True)
class Axis:
    kind: AxisKind
    values: tuple[Any, ...]   # as read (sizes in bytes, paths as written)
    raw: tuple[Any, ...]      # as written in the file (table column values)

    @property
    def name(self) -> str:
        return self.kind.name


@dataclass(frozen=True)
class SweepSpec:
    mode: str
    axes: tuple[Axis, ...]
    plot: PlotSpec
    doc: YamlDoc

    @property
    def base_dir(self) -> Path:
        return Path(self.doc.file).parent

    def points(self, *, raw: bool = False) -> list[dict[str, Any]]:
        """Every point, in order: ``{axis name: value}`` (values as read, or as written)."""
        names = [a.name for a in self.axes]
        columns = [a.raw if raw else a.values for a in self.axes]
        combos: Any = zip(*columns) if self.mode == "zip" else itertools.product(*columns)
        return [dict(zip(names, c)) for c in combos]

    def fail(self, message: str, *path: Any) -> FormatError:
        """An error located at ``axes.<path>`` of the file."""
        loc = ("axes", *path)
        return FormatError(message, file=self.doc.file, line=self.doc.line_of(loc),
                           field=".".join(map(str, loc)))


def load_sweep_file(path: str | Path, *, base_kind: str) -> SweepSpec:
    return sweep_from_doc(load_yaml(path), base_kind=base_kind)


def parse_sweep_file(text: str, *, base_kind: str, file: str = "<sweep>") -> SweepSpec:
    return sweep_from_doc(parse_yaml(text, file), base_kind=base_kind)


def sweep_from_doc(doc: YamlDoc, *, base_kind: str) -> SweepSpec:
    top = validate(SweepFile, doc)
    axes = []
    for name, values in top.axes.items():
        where = ("axes", name)
        try:
            kind = axis_kind(name, base_kind=base_kind)
        except ValueError as exc:
            raise FormatError(str(exc), file=doc.file, line=doc.line_of(where), field=f"axes.{name}") from None
        if not values:
            raise FormatError("an axis needs at least one value", file=doc.file, line=doc.line_of(where),
                              field=f"axes.{name}")
        read = []
        for i, v in enumerate(values):
            try:
                read.append(kind.read(v))
            except ValueError as exc:
                raise FormatError(str(exc), file=doc.file, line=doc.line_of(where + (i,)),
                                  field=f"axes.{name}.{i}") from None
        if len({repr(v) for v in read}) != len(read):
            raise FormatError("an axis repeats a value", file=doc.file, line=doc.line_of(where),
                              field=f"axes.{name}")
        axes.append(Axis(kind, tuple(read), tuple(values)))
    if top.mode == "zip" and len({len(a.values) for a in axes}) > 1:
        lengths = ", ".join(f"{a.name}: {len(a.values)}" for a in axes)
        raise FormatError(f"mode zip needs axes of one length ({lengths})", file=doc.file,
                          line=doc.line_of(("mode",)), field="mode")
    return SweepSpec(mode=top.mode, axes=tuple(axes), plot=top.plot, doc=doc)
