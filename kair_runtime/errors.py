"""What every kair command treats as the user's error: one line on stderr and exit 2.

    try:
        run(cfg)
    except USER_ERRORS as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)

An error type the user can fix in the config, the flags or the input files (ConfigError,
JsonlError, CorpusError, IndexDirError, BackendError, eval's DatasetError) subclasses `UserError`
where it is defined, so no command keeps its own list. KeyError is an unknown registry name
(a format, backend, dataset) and FileNotFoundError a missing input. Anything else is a bug and
keeps its traceback; a command that also owns plain ValueErrors of its inputs adds ValueError at
its call site and says why. A command whose output folder or file the OS may refuse (a full disk,
a read-only or foreign folder, a file where a folder should be) adds OSError the same way and
prints `os_error_line`, which names that folder and the OS's reason.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


class UserError(Exception):
    """Mixed into an error type that a user fixes in the config or the inputs, not in the code."""


USER_ERRORS: tuple[type[BaseException], ...] = (UserError, KeyError, FileNotFoundError)


def os_error_line(e: OSError, target: str | Path, what: str) -> str:
    """One line for an OSError met while a command wrote `target` (`what` says which: "run folder",
    "--out"). An error about `target`, a file in it or one of its parents, or a failed write that
    names no file (a full disk), reads "<what> <target>: <the OS's reason>"; any other OSError
    (a model or an input elsewhere) is shown as it is, not blamed on the output."""
    names = [n for n in (e.filename, e.filename2) if n is not None]
    if e.errno is None or (names and not any(_on_path(n, target) or _beside(n, target) for n in names)):
        return str(e)
    if e.errno in (errno.EEXIST, errno.ENOTDIR, errno.ELOOP):
        # "File exists" from mkdir does not say which part of the path is in the way.
        in_the_way = _in_the_way(Path(target))
        if in_the_way:
            return f"{what} {target}: {in_the_way}"
    # The file in the folder that failed, where it is not the folder itself (nor a temporary sibling).
    inside = [str(n) for n in names if _on_path(n, target) and os.path.abspath(n) != os.path.abspath(target)]
    return f"{what} {target}: {e.strerror or os.strerror(e.errno)}" + (f" ({', '.join(inside)})" if inside else "")


def _on_path(name: str | bytes | int, target: str | Path) -> bool:
    """`name` is `target`, inside it, or one of its parents (lexically: a symlink loop cannot be resolved)."""
    if not isinstance(name, (str, os.PathLike)):
        return False
    a, b = os.path.abspath(name), os.path.abspath(target)
    return a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep)


def _beside(name: str | bytes | int, target: str | Path) -> bool:
    """`name` is what a write of `target` stages beside it: `.NAME.PID.tmp` of an atomic write,
    `.NAME.partial` of a folder rebuilt whole (kair_runtime.jsonl, kair_runtime.rundir)."""
    if not isinstance(name, (str, os.PathLike)):
        return False
    staged, real = os.path.abspath(name), os.path.abspath(target)
    return (os.path.dirname(staged) == os.path.dirname(real)
            and os.path.basename(staged).startswith(f".{os.path.basename(real)}."))


def _in_the_way(path: Path) -> str | None:
    """The part of `path` that stops a folder from being made there, said in words."""
    try:
        for p in (path, *path.parents):
            if p.is_symlink() and not p.exists():
                return f"{p} is a symbolic link that leads nowhere (to itself, a loop or a missing target)"
            if p.exists() and not p.is_dir():
                return f"{p} is a file, not a folder"
    except OSError:  # a parent we may not look into: the OS's own reason is all there is
        pass
    return None
