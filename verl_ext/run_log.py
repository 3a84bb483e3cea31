"""What the terminal shows during a run: the step table and the summary; everything else goes to a log file.

verl's loop runs in a Ray actor, and Ray forwards every worker's output to this process, which prints it
(``ray.init(log_to_driver=True)``, verl's default); with verl's and transformers' warnings interleaved, the step
table is broken up every few lines. `logs_to_file` points this process's file descriptors 1 and 2 at the run's
log file, so Ray's forwarded lines, Python's and C code's alike, land there, and hands the step table a stream to
the terminal it kept. Whatever happens inside, the descriptors are restored on the way out: a failure's message
reaches the terminal, with the log's path. ``verl_ext.show_logs=true`` leaves the screen as verl has it.
"""

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO


@contextmanager
def logs_to_file(path: Path | None, show: bool) -> Iterator[TextIO]:
    """Within the block, this process's stdout and stderr go to `path` (appended); yields the terminal's stream.
    show=True or no path (a run without a step report): nothing moves, the terminal's stream is sys.stdout."""
    if show or path is None:
        yield sys.stdout
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    kept = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(1), "w", buffering=1)
    print(f"verl_ext: Ray's and the workers' logs go to {path} (verl_ext.show_logs=true shows them here)",
          file=terminal)
    try:
        with open(path, "ab", buffering=0) as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                yield terminal
            except BaseException:
                print(f"verl_ext: the run stopped; its logs: {path}", file=terminal)
                raise
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(kept[0], 1)
                os.dup2(kept[1], 2)
    finally:
        os.close(kept[0])
        os.close(kept[1])
        terminal.close()
