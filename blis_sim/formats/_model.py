"""The strict base model every format model derives from, and its Go-style serialisation.

``StrictModel``: pydantic v2, ``extra="forbid"``, ``strict=True`` (no "1" → 1 coercion), frozen.
``construct(model, **values)`` / ``from_data(model, data)``: the model built without pydantic's schema
(its first build costs milliseconds per class: a tenth of the whole ``blis replay`` command) when a
plain check in this module covers every value; anything it does not cover, or any value it doubts,
goes to pydantic's validation, so errors and accepted inputs stay exactly pydantic's.
``to_go(model) -> dict`` lays a model out as the reference's Go structs marshal: fields in declaration
order (by alias), ``None`` (nil pointer) dropped unless the field is in ``_keep_none``, zero values dropped
for fields in ``_omitempty`` (Go's ``omitempty``), dict-typed fields (Go maps) in sorted key order.
"""

# No ``from __future__ import annotations`` here nor in the model modules on a replay's path (hitrate,
# offload, results, trace_data, trace_header): with it every field annotation is a string that pydantic
# compiles and evaluates when its class is defined (~250 fields there: ~15 M instructions, 0.7 % of a
# `blis replay`), and every model would re-evaluate StrictModel's two ClassVar annotations.
import math
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel, ConfigDict, ValidationError

from blis_sim.formats._strict import describe


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True,
                              defer_build=True)  # a schema is built on first validation only

    # Go ``omitempty`` fields: dropped when "", 0, 0.0, False, empty list/dict.
    _omitempty: ClassVar[frozenset[str]] = frozenset()
    # Fields written as ``null`` when None (all other None fields are dropped like nil pointers).
    _keep_none: ClassVar[frozenset[str]] = frozenset()


def _is_zero(v: Any) -> bool:
    return v is False or (not isinstance(v, bool) and v in ("", 0, 0.0)) or (isinstance(v, (list, dict)) and not v)


def to_go(value: Any) -> Any:
    """Plain data (dict/list/scalars) in the reference's key order and omission rules."""
    if isinstance(value, StrictModel):
        out: dict[str, Any] = {}
        cls = type(value)
        for name, f in cls.model_fields.items():
            v = getattr(value, name)
            if v is None and name not in cls._keep_none:
                continue
            if name in cls._omitempty and _is_zero(v):
                continue
            out[f.alias or name] = to_go(v)
        return out
    if isinstance(value, BaseModel):
        return to_go(value.model_dump(mode="python", by_alias=True))
    if isinstance(value, dict):
        return {k: to_go(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [to_go(v) for v in value]
    return value


def validate_data(model: type[Any], data: Any, *, file: str,
                  line_of: Callable[[tuple[Any, ...]], int | None] | None = None) -> Any:
    """``model.model_validate(data)`` with errors as a located :class:`FormatError`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise describe(exc, file=file, line_of=line_of) from None


# ----------------------------------------------------------------------------------- schema-free build

M = TypeVar("M", bound=StrictModel)
_MISS = object()  # "not covered here: ask pydantic"
_NONE = type(None)
_FLOAT_INT = 2 ** 1023  # ints beyond this do not convert to a float
# per class: {key (field name or alias): (field name, annotation, metadata)}, required names, after-validators
_FAST_PLANS: dict[type, Any] = {}


def construct(model: type[M], **values: Any) -> M:
    """``model(**values)``, without building the model's pydantic schema when :func:`from_data`
    covers the values (the same object pydantic's strict validation would give)."""
    out = from_data(model, values)
    return out if out is not None else model(**values)


def from_data(model: type[M], data: Any) -> M | None:
    """``model.model_validate(data)`` for plain data (dicts, lists, scalars, model instances) that
    strict validation accepts unchanged, checked here without pydantic's schema; ``None`` for
    anything else (unknown or missing keys, a wrong type, a value out of range, a field kind or
    validator this check does not know): the caller then validates with pydantic, which accepts or
    reports it as always."""
    if type(data) is not dict:
        return None
    plan = _fast_plan(model)
    if plan is None:
        return None
    keys, required, factories, after = plan
    values: dict[str, Any] = {}
    for key, v in data.items():
        spec = keys.get(key)
        if spec is None or spec[0] in values:
            return None
        name, ann, meta = spec
        v = _value(ann, v)
        if v is _MISS or (meta and v is not None and not _within(meta, v)):
            return None
        values[name] = v
    if not required.issubset(values):
        return None
    given = set(values)
    for name, factory in factories:  # made here: pydantic would inspect each factory's signature
        if name not in given:
            values[name] = factory()
    out = model.model_construct(given, **values)
    for check in after:
        try:
            out = check(out)
        except (ValueError, AssertionError):
            return None
    return out


def _fast_plan(model: type[StrictModel]) -> Any:
    plan = _FAST_PLANS.get(model, _MISS)
    if plan is not _MISS:
        return plan
    cfg, decs = model.model_config, model.__pydantic_decorators__
    plan = None
    if (cfg.get("extra") == "forbid" and cfg.get("strict") and cfg.get("revalidate_instances", "never") == "never"
            and not (decs.validators or decs.field_validators
            or decs.root_validators) and all(d.info.mode == "after" for d in decs.model_validators.values())):
        keys: dict[str, tuple[str, Any, tuple[Any, ...]]] = {}
        by_name = cfg.get("populate_by_name") or cfg.get("validate_by_name")
        for name, f in model.model_fields.items():
            if (f.validation_alias not in (None, f.alias) or f.validate_default
                    or (f.alias not in (None, name) and (not by_name or cfg.get("validate_by_alias") is False))):
                return _cache_plan(model, None)  # keys or defaults this check does not model
            keys[name] = (name, f.annotation, tuple(f.metadata))
            if f.alias and f.alias != name:
                keys[f.alias] = keys[name]
        required = frozenset(n for n, f in model.model_fields.items() if f.is_required())
        factories = tuple((n, f.default_factory) for n, f in model.model_fields.items()
                          if f.default_factory in (list, dict))
        plan = (keys, required, factories, tuple(d.func for d in decs.model_validators.values()))
    return _cache_plan(model, plan)


def _cache_plan(model: type[StrictModel], plan: Any) -> Any:
    _FAST_PLANS[model] = plan
    return plan


def _value(ann: Any, v: Any) -> Any:
    """``v`` as strict validation against ``ann`` gives it, or ``_MISS``."""
    t = type(v)
    if ann is int:
        return v if t is int else _MISS
    if ann is float:
        if t is float:
            return v
        return float(v) if t is int and -_FLOAT_INT < v < _FLOAT_INT else _MISS  # (too big: pydantic says)
    if ann is str:
        return v if t is str else _MISS
    if ann is bool:
        return v if t is bool else _MISS
    if ann is Any:
        return v
    if isinstance(ann, type) and issubclass(ann, StrictModel):
        if t is ann:
            return v
        out = from_data(ann, v) if t is dict else None
        return _MISS if out is None else out
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Union or origin is types.UnionType:
        if v is None:
            return None if _NONE in args else _MISS
        rest = [a for a in args if a is not _NONE]
        return _value(rest[0], v) if len(rest) == 1 else _MISS
    if origin is typing.Literal:
        return v if t is str and v in args and all(type(a) is str for a in args) else _MISS
    if origin is list and t is list and len(args) == 1:
        items = [_value(args[0], x) for x in v]
        return _MISS if _MISS in items else items
    if origin is tuple and t is tuple and len(args) == 2 and args[1] is Ellipsis:
        items = [_value(args[0], x) for x in v]
        return _MISS if _MISS in items else tuple(items)
    if origin is dict and t is dict and len(args) == 2 and args[0] is str:
        out = {}
        for k, x in v.items():
            x = _value(args[1], x)
            if type(k) is not str or x is _MISS:
                return _MISS
            out[k] = x
        return out
    return _MISS


def _within(meta: tuple[Any, ...], v: Any) -> bool:
    """Every constraint of a field holds for ``v`` (False also for a constraint not known here)."""
    for m in meta:
        t = type(m)
        if t is Ge:
            ok = v >= m.ge
        elif t is Gt:
            ok = v > m.gt
        elif t is Le:
            ok = v <= m.le
        elif t is Lt:
            ok = v < m.lt
        elif t is MinLen:
            ok = len(v) >= m.min_length
        elif t is MaxLen:
            ok = len(v) <= m.max_length
        elif getattr(m, "__dict__", None) == {"allow_inf_nan": False}:
            ok = type(v) is not float or math.isfinite(v)
        else:
            return False
        if not ok:
            return False
    return True


def plain_fields(model: StrictModel, exclude: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A flat model's fields as a dict (``model_dump()`` of a model of scalars, without building its
    serialiser)."""
    return {name: getattr(model, name) for name in type(model).model_fields if name not in exclude}
