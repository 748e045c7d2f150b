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
its call site and says why.
"""

from __future__ import annotations


class UserError(Exception):
    """Mixed into an error type that a user fixes in the config or the inputs, not in the code."""


USER_ERRORS: tuple[type[BaseException], ...] = (UserError, KeyError, FileNotFoundError)
