"""One claim policy for output folders: a folder belongs to the config that made it.

`kair eval` (RUN/config.yaml), `kair datagen generate` (OUT/config.yaml) and `kair demo`
(OUT/traces/settings.yaml) each write their resolved config into the folder the first time and,
on every rerun, compare the config they would run with against it: resuming under another
config would mix two runs' records in one folder, so a difference is an error naming the
changed settings as dotted keys (`runtime.loop.max_steps`).

What is not a difference:
  - a `neutral` setting (and everything under it): one that cannot change the folder's records;
  - a key the file lacks whose value now is its field's default: the file was written before
    that field existed, and the config it records is the one it would load as today (a
    missing key loads as its default, kair_runtime.config.from_dict), so adding a field with a
    default never makes existing folders refuse to resume.

An empty claim file records no config, so nothing in it can be shown to match: every setting
differs.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Iterable

import yaml

from kair_runtime.config import ConfigError, _field_default
from kair_runtime.jsonl import atomic_write_text


def claim(folder: Path, resolved: dict[str, Any], schema: type, *, file: str = "config.yaml",
          neutral: Iterable[str] = (), holds: str = "a run with a different config", hint: str) -> None:
    """Write `resolved` (the config as `to_dict` gives it, less any per-machine keys) into
    folder/file, or check it against what is there. `schema` is the dataclass `resolved` came
    from (its field defaults decide which missing keys are compatible). On a difference the
    ConfigError reads "<folder> holds <holds> (differs in: <keys>); <hint>"."""
    path = folder / file
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, yaml.safe_dump(resolved, sort_keys=False))
        return
    old = yaml.safe_load(path.read_text(encoding="utf-8"))
    neutral = tuple(neutral)
    if not isinstance(old, dict) or not old:
        changed = list(resolved)  # an empty file: nothing recorded, so nothing matches
    else:
        changed = changed_keys(old, resolved, schema)
    changed = sorted(k for k in changed if not any(k == n or k.startswith(n + ".") for n in neutral))
    if changed:
        raise ConfigError(f"{folder} holds {holds} (differs in: {', '.join(changed)}); {hint}")


def changed_keys(old: Any, new: Any, schema: Any = None, default: Any = None, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two `to_dict` trees. A list is one setting
    (named as a whole); a key `old` lacks is no difference when `new` holds the field's default,
    `default` being the enclosing field's default object (a section's keys default to it, as
    from_dict loads them: the demo's runtime is not RuntimeConfig())."""
    if isinstance(old, dict) and isinstance(new, dict):
        fields = _fields(schema)
        keys = []
        for key in list(new) + [k for k in old if k not in new]:
            field = fields.get(key)
            field_default = None
            if field is not None:
                field_default = getattr(default, key) if default is not None else _field_default(field[1])
            if key not in old and field is not None and new[key] == _plain(field_default):
                continue
            keys += changed_keys(old.get(key), new.get(key), field[0] if field else None,
                                 field_default if dataclasses.is_dataclass(field_default) else None,
                                 f"{prefix}{key}.")
        return keys
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        inner = _item_type(schema)
        if all(not changed_keys(o, n, inner) for o, n in zip(old, new)):
            return []
        return [prefix.rstrip(".")]
    return [] if old == new else [prefix.rstrip(".")]


def _fields(schema: Any) -> dict[str, tuple[Any, dataclasses.Field]]:
    """name -> (annotated type, Field) of a dataclass, or of the dataclass in an Optional."""
    cls = _dataclass_in(schema)
    if cls is None:
        return {}
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f) for f in dataclasses.fields(cls)}


def _dataclass_in(typ: Any) -> type | None:
    if isinstance(typ, type) and dataclasses.is_dataclass(typ):
        return typ
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        return next((a for a in typing.get_args(typ) if _dataclass_in(a) is not None), None)
    return None


def _item_type(typ: Any) -> Any:
    """The element type of a list[...] annotation (through an Optional), else None."""
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        return next((t for t in map(_item_type, typing.get_args(typ)) if t is not None), None)
    if typing.get_origin(typ) in (list, tuple):
        args = typing.get_args(typ)
        return args[0] if args else None
    return None


def _plain(value: Any) -> Any:
    """A default as `to_dict` writes it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value
