"""Strict loading shared by every format: YAML with line numbers, duplicate keys rejected, and
pydantic validation errors turned into one-line :class:`FormatError`s naming file, line and field.

Usage::

    doc = load_yaml(path)                      # -> YamlDoc(data, lines, file)
    spec = validate(WorkloadSpec, doc)         # FormatError("spec.yaml:12: field 'clients.0.rate_fraction': ...")
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
import re
import types
import typing
from typing import Any, TypeVar

import yaml
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


class _Loader(yaml.SafeLoader):
    pass


# YAML 1.2 exponent floats (``1e+06``, what Go's yaml.v3 writes for large floats; ``1.5e3``) are strings to
# PyYAML's YAML 1.1 resolver; read them as floats, as the reference does.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _object(node: yaml.Node, file: str) -> Any:
    """The value of a node; a tagged scalar that does not convert (``!!int x``) is a located FormatError."""
    try:
        return _Loader.construct_object(_LOADER_SINGLETON, node, deep=True)  # type: ignore[arg-type]
    except (ValueError, TypeError, OverflowError) as exc:
        raise FormatError(f"invalid YAML: {node.tag.rsplit(':', 1)[-1]} value {node.value!r} does not convert "
                          f"({exc})", file=file, line=node.start_mark.line + 1) from None


def _construct(node: yaml.Node, path: Path_, lines: dict[Path_, int], file: str,
               raw: dict[Path_, str] | None = None) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _object(key_node, file)
            if isinstance(key, (list, dict, set)):
                raise FormatError("invalid YAML: a mapping key must be a scalar", file=file,
                                  line=key_node.start_mark.line + 1, field=_dotted(path) or None)
            if key in out:
                raise FormatError(f"duplicate key '{key}'", file=file, line=key_node.start_mark.line + 1,
                                  field=_dotted(path + (key,)))
            child = path + (key,)
            lines[child] = key_node.start_mark.line + 1
            out[key] = _construct(value_node, child, lines, file, raw)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, path + (i,), lines, file, raw) for i, item in enumerate(node.value)]
    value = _object(node, file)
    if raw is not None and node.style is None and value is not None and not isinstance(value, str):
        raw[path] = node.value
    return value


_LOADER_SINGLETON = _Loader("")

#: Values a document may hold with its aliases expanded: no input of ours comes near it, and it stops a
#: few lines of nested aliases (a "billion laughs") from taking exponential time and memory.
MAX_YAML_NODES = 1_000_000


def _expanded_size(node: yaml.Node, memo: dict[int, int], active: set[int]) -> int:
    """Values under ``node`` with aliases expanded (an alias cycle counts as unbounded)."""
    key = id(node)
    if key in memo:
        return memo[key]
    if key in active:
        return MAX_YAML_NODES + 1
    active.add(key)
    size = 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            size += _expanded_size(k, memo, active) + _expanded_size(v, memo, active)
            if size > MAX_YAML_NODES:
                break
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            size += _expanded_size(item, memo, active)
            if size > MAX_YAML_NODES:
                break
    active.discard(key)
    memo[key] = size
    return size


def parse_yaml(text: str, file: str = "<string>") -> YamlDoc:
    """Parse one YAML document strictly. Empty input gives ``data=None``."""
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise FormatError(f"invalid YAML: {exc.problem or exc}", file=file, line=line) from None
    except yaml.reader.ReaderError as exc:
        # PyYAML reports a character it refuses by offset in "<unicode string>", on a second line
        line, column = _line_column(text, exc.position)
        raise FormatError(f"invalid YAML: unacceptable character {_char(exc.character)} at column {column} "
                          f"({exc.reason})", file=file, line=line) from None
    except yaml.YAMLError as exc:
        raise FormatError(f"invalid YAML: {exc}", file=file) from None
    except RecursionError:
        raise FormatError("invalid YAML: nested too deeply", file=file) from None
    lines: dict[Path_, int] = {}
    raw: dict[Path_, str] = {}
    try:
        return YamlDoc(data=_construct_document(node, lines, raw, file), file=file, lines=lines, raw=raw)
    finally:
        # The shared constructor remembers every node it built (PyYAML clears that per document, in
        # construct_document, which we do not use): without this every parse leaked its nodes.
        _LOADER_SINGLETON.constructed_objects.clear()
        _LOADER_SINGLETON.recursive_objects.clear()


def _construct_document(node: yaml.Node | None, lines: dict[Path_, int], raw: dict[Path_, str], file: str) -> Any:
    try:
        if node is not None and _expanded_size(node, {}, set()) > MAX_YAML_NODES:
            raise FormatError(f"invalid YAML: more than {MAX_YAML_NODES} values once aliases are expanded",
                              file=file, line=1)
        return None if node is None else _construct(node, (), lines, file, raw)
    except yaml.MarkedYAMLError as exc:  # a tag the safe loader refuses (``!!python/object``), a bad timestamp
        mark = exc.problem_mark or exc.context_mark
        raise FormatError(f"invalid YAML: {exc.problem or exc.context}", file=file,
                          line=mark.line + 1 if mark else None) from None
    except RecursionError:
        raise FormatError("invalid YAML: nested too deeply", file=file) from None


def _line_column(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of character ``offset`` of ``text``."""
    start = text.rfind("\n", 0, offset) + 1
    return text.count("\n", 0, offset) + 1, offset - start + 1


def _char(character: int | str) -> str:
    code = character if isinstance(character, int) else ord(character[:1] or "\0")
    return f"#x{code:04x}"


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


def _dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path)


def describe(exc: ValidationError, doc: YamlDoc | None = None, file: str | None = None,
             line_of: Any = None) -> FormatError:
    """First error of a pydantic ``ValidationError`` as a FormatError (file, line, field, reason).

    ``line_of`` may map a location tuple to a line for non-YAML inputs (e.g. a CSV row number).
    """
    err = exc.errors(include_url=False)[0]
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    reason = err["msg"]
    if err["type"] == "extra_forbidden":
        reason = f"unknown key '{loc[-1]}'" if loc else "unknown key"
    elif err["type"] == "missing":
        reason = "required field is missing"
    elif "input" in err and not isinstance(err["input"], (dict, list)):
        reason = f"{reason} (got {err['input']!r})"
    more = len(exc.errors()) - 1
    if more:
        reason += f" (and {more} more error{'s' if more > 1 else ''})"
    line = None
    if doc is not None:
        line = doc.line_of(loc)
        file = doc.file
    elif line_of is not None:
        line = line_of(loc)
    return FormatError(reason, file=file, line=line, field=_dotted(loc) or None)


def validate(model: type[M], doc: YamlDoc, *, context: dict[str, Any] | None = None,
             plain_strings: bool = False) -> M:
    """Validate a parsed YAML document against a strict pydantic model.

    ``plain_strings=True`` gives string fields the source text of plain scalars that YAML resolved to
    something else (``vllm_commit: 0000...`` stays the string, not the int 0), as yaml.v3 does.
    """
    if doc.data is None:
        raise FormatError("file is empty", file=doc.file)
    data = _restore_strings(model, doc.data, (), doc.raw) if plain_strings and doc.raw else doc.data
    if context is None:  # plain data strict validation accepts as it is: no schema to build
        from blis_sim.formats._model import from_data

        fast = from_data(model, data)
        if fast is not None:
            return fast
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
