"""The strict base model every format model derives from, and its Go-style serialisation.

``StrictModel``: pydantic v2, ``extra="forbid"``, ``strict=True`` (no "1" → 1 coercion), frozen.
``construct(model, **values)``: a model built in code, through pydantic's validation (the same rules
as a file's).
``to_go(model) -> dict`` lays a model out as the reference's Go structs marshal: fields in declaration
order (by alias), ``None`` (nil pointer) dropped unless the field is in ``_keep_none``, zero values dropped
for fields in ``_omitempty`` (Go's ``omitempty``), dict-typed fields (Go maps) in sorted key order.
"""

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

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


M = TypeVar("M", bound="StrictModel")


def validate_data(model: type[Any], data: Any, *, file: str,
                  line_of: Callable[[tuple[Any, ...]], int | None] | None = None) -> Any:
    """``model.model_validate(data)`` with errors as a located :class:`FormatError`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise describe(exc, file=file, line_of=line_of) from None


def construct(model: type[M], **values: Any) -> M:
    """``model(**values)``: a model built in code, validated by pydantic like one read from a file."""
    return model(**values)


def plain_fields(model: StrictModel, exclude: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A flat model's fields as a dict (``model_dump()`` of a model of scalars, without building its
    serialiser)."""
    return {name: getattr(model, name) for name in type(model).model_fields if name not in exclude}
