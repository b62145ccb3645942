"""The PyYAML side of :func:`blis_sim.formats._strict.parse_yaml`: one document composed by PyYAML's safe
loader (YAML 1.2 exponent floats added), constructed with the line of every key and item, the source
text of plain scalars that resolve to a non-string, duplicate keys and alias bombs refused, every
error a located :class:`~blis_sim.errors.FormatError`. Imported on the first document parsed, and by
the YAML writer (``_Loader``'s resolver)."""
from __future__ import annotations

import re
from typing import Any

import yaml

from blis_sim.errors import FormatError
from blis_sim.formats._strict import dotted

Path_ = tuple[str | int, ...]


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
        return _Loader.construct_object(_LOADER_SINGLETON, node, deep=True)
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
                                  line=key_node.start_mark.line + 1, field=dotted(path) or None)
            if key in out:
                raise FormatError(f"duplicate key '{key}'", file=file, line=key_node.start_mark.line + 1,
                                  field=dotted(path + (key,)))
            child = path + (key,)
            lines[child] = key_node.start_mark.line + 1
            out[key] = _construct(value_node, child, lines, file, raw)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, path + (i,), lines, file, raw) for i, item in enumerate(node.value)]
    value = _object(node, file)
    style = node.style if isinstance(node, yaml.ScalarNode) else None  # a scalar's quoting, if any
    if raw is not None and style is None and value is not None and not isinstance(value, str):
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


def parse(text: str, file: str) -> tuple[Any, dict[Path_, int], dict[Path_, str]]:
    """``(data, lines, raw)`` of one YAML document parsed by PyYAML (see ``YamlDoc``)."""
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
        return _construct_document(node, lines, raw, file), lines, raw
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
