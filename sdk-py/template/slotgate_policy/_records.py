"""Records of the WIT contract built from their generated dataclasses, with every field a caller
leaves out set to its "changes nothing" value. The field lists are read from the bindings, not
copied here, so a field the WIT gains is filled in without touching the SDK."""

import dataclasses
import typing


def build(cls, fill_scalars=False, **given):
    """An instance of the generated record `cls` with the fields in `given`; the others are
    `None` (an option), `False`, an empty list or an empty nested record. A plain number or string
    has no neutral value, so it must be given, unless `fill_scalars` (test inputs) makes it 0 or
    ""."""
    values = {}
    for field in dataclasses.fields(cls):
        if field.name in given:
            values[field.name] = given.pop(field.name)
        else:
            values[field.name] = _default(cls, field, fill_scalars)
    if given:
        raise TypeError(f"{cls.__name__} has no field {', '.join(sorted(given))}")
    return cls(**values)


def _default(cls, field, fill_scalars):
    ty = field.type
    origin = typing.get_origin(ty)
    if origin is typing.Union and type(None) in typing.get_args(ty):
        return None
    if ty is bool:
        return False
    if origin is list:
        return []
    if dataclasses.is_dataclass(ty):
        return build(ty, fill_scalars)
    if fill_scalars and ty in (int, float, str):
        return ty()
    raise TypeError(f"{cls.__name__}.{field.name} is required")
