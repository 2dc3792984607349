"""How a `biplane` command ends when its user or its reader stops it, as other Unix tools do.

- Ctrl-C (SIGINT): exit 130, no traceback.
- SIGTERM: exit 143; an asyncio command's main task is cancelled first, so what it holds
  (a producer's queued records, open connections) is closed on the way out.
- A closed stdout (`biplane topic list | head -1`): exit 141, silently.

The codes are 128 + the signal's number, what a shell reports for a process the signal
killed, so scripts that check `$?` see the same thing they would for `cat` or `grep`.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any, Coroutine, TypeVar

from common import eventloop

T = TypeVar("T")

EXIT_INTERRUPTED = 128 + signal.SIGINT      # 130
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE     # 141
EXIT_TERMINATED = 128 + signal.SIGTERM      # 143


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, like KeyboardInterrupt, so no `except Exception`
    on the way up mistakes it for a failure to handle and carry on from."""


def raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def install_sigterm() -> None:
    """SIGTERM raises Terminated in the main thread (the default would end the process
    without running any cleanup)."""
    signal.signal(signal.SIGTERM, raise_terminated)


def silence_stdout() -> None:
    """Point stdout at /dev/null: once its reader is gone, the interpreter's own flush at exit
    would otherwise print 'Exception ignored ... BrokenPipeError'."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on Biplane's event loop. Ctrl-C cancels it and raises KeyboardInterrupt (as
    asyncio.Runner does); SIGTERM cancels it and raises Terminated. Either way `main`'s
    `async with` blocks close before the exception leaves."""
    async def guarded() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        terminated = False

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        previous = signal.getsignal(signal.SIGTERM)
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await main
        except asyncio.CancelledError:
            if terminated:
                raise Terminated() from None
            raise
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, previous)

    return eventloop.run(guarded())
