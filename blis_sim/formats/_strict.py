"""Strict loading shared by every format: YAML with line numbers, duplicate keys rejected, and
pydantic validation errors turned into one-line :class:`FormatError`s naming file, line and field.

Usage::

    doc = load_yaml(path)                      # -> YamlDoc(data, lines, file)
    spec = validate(WorkloadSpec, doc)         # FormatError("spec.yaml:12: field 'clients.0.rate_fraction': ...")
"""
from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from blis_sim.errors import FormatError

Path_ = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class YamlDoc:
    """Parsed YAML plus the 1-based line of every mapping key / sequence item, by path."""

    data: Any
    file: str
    lines: Mapping[Path_, int] = field(default_factory=dict)
    # Source text of plain scalars that resolved to a non-string (``0042`` -> 42, ``yes`` -> True), by path:
    # what Go's yaml.v3 puts into a string field (see ``validate(..., plain_strings=True)``).
    raw: Mapping[Path_, str] = field(default_factory=dict)

    def line_of(self, path: Path_) -> int | None:
        """Line of ``path`` or of its nearest ancestor that has one."""
        for n in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:n]))
            if line is not None:
                return line
        return None


def parse_yaml(text: str, file: str = "<string>") -> YamlDoc:
    """Parse one YAML document strictly (PyYAML, :mod:`._yamlin`, imported on first use). Empty
    input gives ``data=None``."""
    from blis_sim.formats import _yamlin

    data, lines, raw = _yamlin.parse(text, file)
    return YamlDoc(data=data, file=file, lines=lines, raw=raw)


def read_text(path: str | Path) -> str:
    """A UTF-8 input file's text; a missing, unreadable or non-UTF-8 file is a FormatError naming it."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FormatError("file not found", file=str(p)) from None
    except UnicodeDecodeError as exc:
        raise FormatError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=str(p)) from None
    except OSError as exc:  # a directory, no permission, ...
        raise FormatError(f"cannot read: {exc.strerror or exc}", file=str(p)) from None


def load_yaml(path: str | Path) -> YamlDoc:
    return parse_yaml(read_text(path), str(Path(path)))


def dotted(path: Path_) -> str:
    """A location tuple as a field path (``clients.0.rate``)."""
    return ".".join(str(p) for p in path)


def describe(exc: ValidationError, doc: YamlDoc | None = None, file: str | None = None,
             line_of: Any = None) -> FormatError:
    """First error of a pydantic ``ValidationError`` as a FormatError (file, line, field, reason).

    ``line_of`` may map a location tuple to a line for non-YAML inputs (e.g. a CSV row number).
    """
    errors = exc.errors(include_url=False)
    more = len(errors) - 1
    suffix = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
    return describe_error(errors[0], doc, file, line_of, suffix)


def describe_each(exc: ValidationError, doc: YamlDoc) -> list[tuple[Path_, FormatError]]:
    """Every error of a pydantic ``ValidationError``, each with its location (for reporting them together)."""
    return [(error_loc(err), describe_error(err, doc)) for err in exc.errors(include_url=False)]


def error_loc(err: Any) -> Path_:
    """A pydantic error's location without the validator steps pydantic puts in it."""
    return tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))


def describe_error(err: Any, doc: YamlDoc | None = None, file: str | None = None, line_of: Any = None,
                   suffix: str = "") -> FormatError:
    """One pydantic error (an item of ``ValidationError.errors()``) as a FormatError."""
    loc = error_loc(err)
    reason = err["msg"]
    if err["type"] == "extra_forbidden":
        reason = f"unknown key '{loc[-1]}'" if loc else "unknown key"
    elif err["type"] == "missing":
        reason = "required field is missing"
    elif "input" in err and not isinstance(err["input"], (dict, list)):
        reason = f"{reason} (got {err['input']!r})"
    reason += suffix
    line = None
    if doc is not None:
        line = doc.line_of(loc)
        file = doc.file
    elif line_of is not None:
        line = line_of(loc)
    return FormatError(reason, file=file, line=line, field=dotted(loc) or None)


def validate(model: type[M], doc: YamlDoc, *, context: dict[str, Any] | None = None,
             plain_strings: bool = False) -> M:
    """Validate a parsed YAML document against a strict pydantic model.

    ``plain_strings=True`` gives string fields the source text of plain scalars that YAML resolved to
    something else (``vllm_commit: 0000...`` stays the string, not the int 0), as yaml.v3 does.
    """
    if doc.data is None:
        raise FormatError("file is empty", file=doc.file)
    data = _restore_strings(model, doc.data, (), doc.raw) if plain_strings and doc.raw else doc.data
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise describe(exc, doc) from None


def _accepts_str(annotation: Any) -> bool:
    if annotation is str:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return any(_accepts_str(a) for a in typing.get_args(annotation))
    return False


def _submodel(annotation: Any) -> Any:
    """The model / list / dict shape inside Optional[...] or Annotated[...]."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for a in typing.get_args(annotation):
            inner = _submodel(a)
            if inner is not None:
                return inner
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if origin in (list, dict):
        return annotation
    return None


def _restore_strings(annotation: Any, data: Any, path: Path_, raw: Mapping[Path_, str]) -> Any:
    """Walk ``data`` along the model's annotations; put raw text back where a string is expected."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(data, dict):
        by_key = {(f.alias or name): f.annotation for name, f in annotation.model_fields.items()}
        out = {}
        for key, value in data.items():
            ann = by_key.get(key)
            if ann is None:
                out[key] = value
            elif not isinstance(value, str) and _accepts_str(ann) and (path + (key,)) in raw:
                out[key] = raw[path + (key,)]
            else:
                inner = _submodel(ann)
                out[key] = value if inner is None else _restore_strings(inner, value, path + (key,), raw)
        return out
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is list and isinstance(data, list) and args:
        return [_restore_one(args[0], v, path + (i,), raw) for i, v in enumerate(data)]
    if origin is dict and isinstance(data, dict) and len(args) == 2:
        return {k: _restore_one(args[1], v, path + (k,), raw) for k, v in data.items()}
    return data


def _restore_one(annotation: Any, value: Any, path: Path_, raw: Mapping[Path_, str]) -> Any:
    if not isinstance(value, str) and _accepts_str(annotation) and path in raw:
        return raw[path]
    inner = _submodel(annotation)
    return value if inner is None else _restore_strings(inner, value, path, raw)
