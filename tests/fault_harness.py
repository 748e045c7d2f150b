"""python tests/fault_harness.py KILL_AT COUNT_FILE [--file-writes] kair-args...

Runs the `kair` command line in this process and SIGKILLs it at its KILL_AT-th durable write
(0: never), as a power cut or `kill -9` would stop it: no finally block, no atexit. A durable
write is an os.fsync (counted after it returns: the data is on disk) or an
os.replace/os.rename (counted before it runs: a file or folder about to take its final name).

--file-writes counts plain file writes too, for code that never fsyncs or renames (the Trainer
writes a checkpoint's files in place): a file opened for writing (counted after the open, so
the kill leaves it empty or cut short), torch.save and safetensors' save_file (counted before:
the file is not there yet).

A run that is not killed writes how many it saw to COUNT_FILE, so a test can spread its kill
points over them. Test-only: nothing in the project knows about it (tests/test_faults.py).
"""

from __future__ import annotations

import builtins
import os
import signal
import sys


def arm(kill_at: int, file_writes: bool) -> list[int]:
    seen = [0]

    def hit() -> None:
        seen[0] += 1
        if seen[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def after(fn):
        def wrapped(*args, **kwargs):
            result = fn(*args, **kwargs)
            hit()
            return result
        return wrapped

    def before(fn):
        def wrapped(*args, **kwargs):
            hit()
            return fn(*args, **kwargs)
        return wrapped

    os.fsync = after(os.fsync)
    os.replace = before(os.replace)
    os.rename = before(os.rename)
    if file_writes:
        real_open = builtins.open

        def counted_open(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            if any(c in mode for c in "wax+") and isinstance(file, (str, os.PathLike)):
                hit()
            return f

        builtins.open = counted_open
        # Patched before anything imports them by name (PEFT binds save_file at import).
        import safetensors.torch
        import torch

        torch.save = before(torch.save)
        safetensors.torch.save_file = before(safetensors.torch.save_file)
    return seen


def main() -> int:
    kill_at, count_file, *argv = sys.argv[1:]
    file_writes = argv[:1] == ["--file-writes"]
    argv = argv[file_writes:]
    seen = arm(int(kill_at), file_writes)
    # This script's folder (tests/) heads sys.path, and its kair_runtime/ (the tests') would shadow
    # the package.
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
    from kair_runtime.cli import main as kair

    sys.argv = ["kair", *argv]
    try:
        kair()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    fd = os.open(count_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # not through the counted open
    os.write(fd, str(seen[0]).encode())
    os.close(fd)
    return code


if __name__ == "__main__":
    sys.exit(main())
