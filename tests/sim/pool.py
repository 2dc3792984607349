"""Seeded runs spread over every CPU this process may use.

Each run is pure and seeded, so the outcome is the one a loop would give, in a fraction of the
suite's time on a machine with more than one core. Forked workers: the test module that names
the function is already imported there.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable, TypeVar

J = TypeVar("J")
R = TypeVar("R")


def run_all(fn: Callable[[J], R], jobs: Iterable[J], *, chunksize: int = 5) -> list[R]:
    """`[fn(job) for job in jobs]`, in order, on up to 8 worker processes."""
    jobs = list(jobs)
    workers = min(len(os.sched_getaffinity(0)), 8, len(jobs))
    if workers < 2:
        return [fn(job) for job in jobs]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(fn, jobs, chunksize=chunksize))
