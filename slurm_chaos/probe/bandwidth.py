"""nccl-tests' bandwidth definitions for all_reduce, without torch: the probe measures with them and
the analysis judges with them, so the two numbers are the same number.

algbw = bytes / time; busbw = algbw x 2(n-1)/n, n the number of ranks (each rank sends and receives
2(n-1)/n of the buffer in a ring all_reduce, so busbw compares with the links' speed at any n).
"""

from __future__ import annotations


def alg_bandwidth(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes per second) of one all_reduce of `nbytes`."""
    return nbytes / seconds / 1e9


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' busbw for all_reduce: algbw x 2(n-1)/n."""
    return algbw * busbw_factor(world_size)


def busbw_factor(world_size: int) -> float:
    """2(n-1)/n: 0 for a single rank (nothing crosses a link), 1 for two."""
    return 2 * (world_size - 1) / world_size
