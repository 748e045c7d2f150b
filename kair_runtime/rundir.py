"""Output folders: who may write one (`hold`), how one is replaced whole (`replaced_folder`), and
the claim policy (`claim`): a folder belongs to the config that made it.

One writer at a time. A resumable command (eval, datagen generate/silver, the demo, training)
holds its folder's lock file `.kair.lock` while it writes; a second command on the same folder
is refused with one line naming the holder. The lock is an flock: the kernel releases it when
its process dies, so a killed run never leaves a folder stuck. Taking the lock also removes what
killed writers left behind (`.NAME.PID.tmp` files of atomic writes): nobody else writes there.

Whole or not at all. A command whose output is derived in one go (an index, SFT data) builds it
in `.NAME.partial` beside the folder and swaps it in only once complete, so a failure or a kill
leaves the old folder as it was.

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
import errno
import fcntl
import json
import os
import re
import shutil
import sys
import time
import types
import typing
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import yaml

from kair_runtime.config import ABSENT_MEANS, ConfigError, _field_default
from kair_runtime.errors import UserError
from kair_runtime.jsonl import atomic_write_text

LOCK_FILE = ".kair.lock"
_ORPHAN = re.compile(r"^\..+\.(\d+)\.tmp$")  # jsonl.atomic_write's temporary name


class FolderBusy(UserError, RuntimeError):
    """Another live process holds the folder."""


@contextmanager
def hold(folder: str | Path, part: str | None = None) -> Iterator[Path]:
    """Hold `folder` (created if missing) for this process while the block writes it; another
    process holding it is a FolderBusy naming it. Reentrant within one process (a command that
    calls another on the same folder). Orphaned temporary files of killed writers are removed
    once the lock is ours. `part`: hold only that part of the folder (one shard of a generation
    that several processes write side by side)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (LOCK_FILE if part is None else f".kair.{part}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = _holder(path)
            if holder.get("pid") == os.getpid():  # this process already holds it, through another fd
                yield folder
                return
            raise FolderBusy(f"{folder}{'' if part is None else f' ({part})'} is being written by another run (pid {holder.get('pid', '?')}, since "
                             f"{holder.get('since', '?')}: {holder.get('command', '?')}); wait for it to finish, "
                             "or use another folder") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                                 "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300]}).encode())
        remove_orphans(folder)
        yield folder
    finally:
        os.close(fd)  # releases the flock


def _holder(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def remove_orphans(folder: Path) -> list[Path]:
    """Delete the temporary files that atomic writes of dead processes left anywhere under
    `folder`; a live process's (say, a concurrent reader's own) are kept. Returns what went."""
    gone = []
    for path in folder.rglob(".*.tmp"):
        m = _ORPHAN.match(path.name)
        if m and path.is_file() and not _alive(int(m.group(1))):
            path.unlink(missing_ok=True)
            gone.append(path)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


@contextmanager
def replaced_folder(out: str | Path, marker: str) -> Iterator[Path]:
    """Yield an empty staging folder for `out`'s new contents; when the block succeeds, the
    staging folder replaces `out` (the old one is removed), otherwise `out` stays as it was. The
    staging folder of an earlier, failed run is kept for the block to resume from if it can
    (dense index shards) and its orphans are removed. `marker`: a file every complete `out`
    holds; an existing, non-empty `out` without it is refused, so a mistyped --out never
    replaces a folder of other files."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / marker).exists():
        raise UserError(f"{out} holds files that are not this command's output (no {marker}); "
                        "choose a new or empty folder")
    staging = out.with_name(f".{out.name}.partial")
    with hold(staging):
        try:
            yield staging
        except BaseException:
            if {p.name for p in staging.iterdir()} <= {LOCK_FILE}:  # nothing worth resuming from
                shutil.rmtree(staging, ignore_errors=True)
            raise
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            out.rename(old)
        staging.rename(out)
        shutil.rmtree(old, ignore_errors=True)


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
    from_dict loads them: the demo's runtime is not RuntimeConfig()), or the value the field's
    ABSENT_MEANS metadata says a folder from before the field meant."""
    if isinstance(old, dict) and isinstance(new, dict):
        fields = _fields(schema)
        keys = []
        for key in list(new) + [k for k in old if k not in new]:
            field = fields.get(key)
            field_default = None
            if field is not None:
                field_default = getattr(default, key) if default is not None else _field_default(field[1])
            if key not in old and field is not None and new[key] == _plain(
                    field[1].metadata.get(ABSENT_MEANS, field_default)):
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
