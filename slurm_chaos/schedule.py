"""The fault schedule of one job: a seeded random switchback of on/off blocks after a warm-up.

A switchback schedule toggles a reversible fault inside one job, so the fault's effect is measured
against the same job's own unfaulted steps (same nodes, same thermal state, same neighbours) instead
of against another run. Its layout, in steps (the probe's step index, not wall-clock time)::

    | warm-up pre-roll | pair 1: block, block | pair 2: block, block | ... | (unmeasured tail)

- blocks come in pairs of equal length, drawn uniformly from ``min_block..max_block`` steps, so a
  periodic disturbance (a checkpoint every N steps, a thermal cycle) cannot line up with the
  blocks, and the on and off steps are balanced exactly. Each pair is one unit of the
  randomisation test, so for the same steps short blocks make a sharper test (more units, less
  drift inside each): 10-15 steps by default, measured on the synthetic model at 500 steps as an
  MDE of about 2.5% where 10-25 gave 2.7% (bench/bench_sensitivity.py), and on recorded sandbox
  noise better than 4-6 or 20-25 with the shipped statistic (bench/bench_noise_sandbox.py);
  up to 25 for faults that are slow to settle;
- within each pair a fair coin decides which block is on: slow drift within the run moves both
  blocks of a pair alike and cancels in their difference;
- the first ``transition_steps`` of every block are dropped (state 2), whether or not the fault
  changed there, so which steps are measured does not depend on the assignment (the randomisation
  test in :mod:`.switchback` relies on that), and the step during which the fault was applied or
  undone never counts. One step by default: the ranks toggle at a step boundary and the agent
  acknowledges within milliseconds; a fault that settles slowly asks for more, and a step the
  probe records in another state than scheduled (a late acknowledgement) is dropped as well.

Per-step states: 0 off, 1 on, 2 not measured (warm-up, transition, or after the last pair). A
placebo schedule is the same object with ``placebo`` set: the blocks and the assignment are drawn
and analysed as usual, but nothing is toggled, so every "effect" it finds is noise.

The JSON form (:meth:`SwitchbackSchedule.to_json`) is recorded in the run directory and in the
probe's HDF5 attributes; the recorded assignment, not a regeneration from the seed, is what the
analysis trusts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from slurm_chaos.errors import DataError

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

OFF = 0
ON = 1
DROPPED = 2

DESIGN = "switchback"
SCHEMA = 1
WARMUP_STEPS = 30
MIN_BLOCK = 10
MAX_BLOCK = 15
TRANSITION_STEPS = 1


@dataclass(frozen=True)
class SwitchbackSchedule:
    """Blocks of a switchback schedule; block ``i`` starts at ``block_starts[i]``.

    ``assignment[i]`` is 1 when block ``i`` is on; blocks ``2j`` and ``2j + 1`` form pair ``j`` and
    have opposite states. ``affected_ranks``/``affected_hosts`` record where the fault acts.
    """

    seed: int
    warmup_steps: int
    block_steps: tuple[int, ...]
    assignment: tuple[int, ...]
    transition_steps: int = TRANSITION_STEPS
    min_block: int = MIN_BLOCK
    max_block: int = MAX_BLOCK
    placebo: bool = False
    affected_ranks: tuple[int, ...] = ()
    affected_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem:
            raise ValueError(problem)

    # --- layout ---------------------------------------------------------------------------------

    @property
    def pairs(self) -> int:
        return len(self.block_steps) // 2

    @property
    def block_starts(self) -> tuple[int, ...]:
        starts = np.cumsum((self.warmup_steps, *self.block_steps))[:-1]
        return tuple(int(s) for s in starts)

    @property
    def end_step(self) -> int:
        """First step after the last block."""
        return self.warmup_steps + sum(self.block_steps)

    def step_states(self, steps: int | IntArray) -> IntArray:
        """Scheduled state (OFF, ON, DROPPED) of each step; an int means steps ``0..n-1``.

        A placebo schedule reports the states its blocks would have: the analysis needs them.
        """
        index = np.arange(steps) if isinstance(steps, int) else np.asarray(steps, dtype=np.int64)
        block = self.block_of(index)
        states = np.full(index.shape, DROPPED, dtype=np.int64)
        inside = block >= 0
        offset = index[inside] - np.asarray(self.block_starts, dtype=np.int64)[block[inside]]
        measured = offset >= self.transition_steps
        states[np.flatnonzero(inside)[measured]] = np.asarray(self.assignment)[block[inside][measured]]
        return states

    def block_of(self, steps: IntArray) -> IntArray:
        """Index of the block each step lies in, -1 for the warm-up and after the last block."""
        bounds = np.asarray((*self.block_starts, self.end_step), dtype=np.int64)
        block = np.searchsorted(bounds, np.asarray(steps, dtype=np.int64), side="right") - 1
        return np.where((block >= 0) & (block < len(self.block_steps)), block, -1).astype(np.int64)

    def fault_active(self, steps: int) -> BoolArray:
        """Whether the fault is applied during each of steps ``0..n-1`` (never, for a placebo)."""
        block = self.block_of(np.arange(steps))
        on = np.zeros(steps, dtype=np.bool_)
        if not self.placebo:
            inside = block >= 0
            on[inside] = np.asarray(self.assignment)[block[inside]] == ON
        return on

    def truncated(self, steps: int) -> SwitchbackSchedule:
        """The schedule of a run that recorded only ``steps`` steps: complete pairs only."""
        starts = self.block_starts
        keep = 0
        while keep < self.pairs and starts[2 * keep + 1] + self.block_steps[2 * keep + 1] <= steps:
            keep += 1
        return _replace_blocks(self, self.block_steps[: 2 * keep], self.assignment[: 2 * keep])

    # --- re-randomisation -----------------------------------------------------------------------

    def all_assignments(self) -> IntArray:
        """Every assignment this design could have drawn (2^pairs rows, blocks columns)."""
        return all_pair_assignments(self.pairs)

    def random_assignments(self, n: int, rng: np.random.Generator) -> IntArray:
        """``n`` assignments drawn as the generator draws them: a fair coin per pair."""
        return random_pair_assignments(self.pairs, n, rng)

    # --- JSON -----------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "design": DESIGN,
            "schema": SCHEMA,
            "seed": self.seed,
            "warmup_steps": self.warmup_steps,
            "block_steps": list(self.block_steps),
            "assignment": list(self.assignment),
            "transition_steps": self.transition_steps,
            "min_block": self.min_block,
            "max_block": self.max_block,
            "placebo": self.placebo,
            "affected_ranks": list(self.affected_ranks),
            "affected_hosts": list(self.affected_hosts),
        }

    def dumps(self) -> str:
        """Compact JSON text, as stored in an HDF5 attribute."""
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)


def all_pair_assignments(pairs: int) -> IntArray:
    """Every assignment of a paired design with ``pairs`` pairs (2^pairs rows, 2 * pairs columns)."""
    orders = (np.arange(2**pairs, dtype=np.int64)[:, None] >> np.arange(pairs, dtype=np.int64)) & 1
    return _from_pair_orders(orders)


def random_pair_assignments(pairs: int, n: int, rng: np.random.Generator) -> IntArray:
    """``n`` assignments of a paired design, drawn as :func:`switchback_schedule` draws them."""
    return _from_pair_orders(rng.integers(0, 2, size=(n, pairs), dtype=np.int8))


def _from_pair_orders(on_first: npt.NDArray[np.integer[Any]]) -> IntArray:
    """Assignments (rows) from one 0/1 per pair: 1 puts the pair's first block on."""
    orders = on_first.astype(np.int8)
    return np.stack([orders, 1 - orders], axis=2).reshape(orders.shape[0], -1).astype(np.int64)


def _replace_blocks(
    s: SwitchbackSchedule, blocks: tuple[int, ...], assignment: tuple[int, ...]
) -> SwitchbackSchedule:
    return SwitchbackSchedule(
        s.seed,
        s.warmup_steps,
        blocks,
        assignment,
        s.transition_steps,
        s.min_block,
        s.max_block,
        s.placebo,
        s.affected_ranks,
        s.affected_hosts,
    )


def _problem(s: SwitchbackSchedule) -> str:
    """Why the schedule is inconsistent, or ''."""
    if s.warmup_steps < 0:
        return f"warmup_steps: expected >= 0, got {s.warmup_steps}"
    if not 1 <= s.min_block <= s.max_block:
        return f"min_block/max_block: expected 1 <= {s.min_block} <= {s.max_block}"
    if not 0 <= s.transition_steps < s.min_block:
        return f"transition_steps: expected 0 <= {s.transition_steps} < min_block {s.min_block}"
    if len(s.block_steps) != len(s.assignment):
        return f"assignment: {len(s.assignment)} entries for {len(s.block_steps)} blocks"
    if len(s.block_steps) % 2:
        return f"block_steps: blocks come in pairs, got {len(s.block_steps)}"
    if any(not s.min_block <= b <= s.max_block for b in s.block_steps):
        return f"block_steps: each must lie in {s.min_block}..{s.max_block}, got {list(s.block_steps)}"
    for j in range(0, len(s.block_steps), 2):
        if s.block_steps[j] != s.block_steps[j + 1]:
            return f"block_steps: blocks {j} and {j + 1} form a pair and must be equally long"
        if sorted(s.assignment[j : j + 2]) != [OFF, ON]:
            return f"assignment: blocks {j} and {j + 1} form a pair: one must be on (1), one off (0)"
    return ""


def switchback_schedule(
    steps: int,
    seed: int,
    *,
    warmup_steps: int = WARMUP_STEPS,
    min_block: int = MIN_BLOCK,
    max_block: int = MAX_BLOCK,
    transition_steps: int = TRANSITION_STEPS,
    placebo: bool = False,
    affected_ranks: tuple[int, ...] = (),
    affected_hosts: tuple[str, ...] = (),
) -> SwitchbackSchedule:
    """A seeded random schedule filling ``steps`` steps with as many pairs as fit.

    The last pair is shortened (not below ``min_block``) to use the remaining steps; what is left
    after it (fewer than ``2 * min_block`` steps) is not measured.
    """
    rng = np.random.default_rng(seed)
    blocks: list[int] = []
    assignment: list[int] = []
    left = steps - warmup_steps
    while left >= 2 * min_block:
        length = min(int(rng.integers(min_block, max_block + 1)), left // 2)
        first = int(rng.integers(0, 2))
        blocks += [length, length]
        assignment += [first, 1 - first]
        left -= 2 * length
    return SwitchbackSchedule(
        seed=seed,
        warmup_steps=warmup_steps,
        block_steps=tuple(blocks),
        assignment=tuple(assignment),
        transition_steps=transition_steps,
        min_block=min_block,
        max_block=max_block,
        placebo=placebo,
        affected_ranks=affected_ranks,
        affected_hosts=affected_hosts,
    )


def placebo_of(schedule: SwitchbackSchedule) -> SwitchbackSchedule:
    """The same blocks and assignment with nothing toggled."""
    return SwitchbackSchedule(**{**_fields(schedule), "placebo": True})


def _fields(s: SwitchbackSchedule) -> dict[str, Any]:
    return {name: getattr(s, name) for name in SwitchbackSchedule.__dataclass_fields__}


_INT_KEYS = ("seed", "warmup_steps", "transition_steps", "min_block", "max_block")


def schedule_from_json(data: Mapping[str, Any] | str, source: str = "fault_schedule") -> SwitchbackSchedule:
    """Read a schedule back from :meth:`SwitchbackSchedule.to_json` (or its text); errors name
    ``source`` and the key."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise DataError(f"{source}: not JSON ({exc})") from exc
    if not isinstance(data, Mapping):
        raise DataError(f"{source}: expected a JSON object, got {type(data).__name__}")
    if data.get("design") != DESIGN:
        raise DataError(f"{source}: design: expected {DESIGN!r}, got {data.get('design')!r}")
    if data.get("schema") != SCHEMA:
        raise DataError(f"{source}: schema: expected {SCHEMA}, got {data.get('schema')!r}")
    values: dict[str, Any] = {k: _int(data, k, source) for k in _INT_KEYS}
    values["block_steps"] = _ints(data, "block_steps", source)
    values["assignment"] = _ints(data, "assignment", source)
    values["affected_ranks"] = _ints(data, "affected_ranks", source, required=False)
    hosts = data.get("affected_hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise DataError(f"{source}: affected_hosts: expected a list of host names, got {hosts!r}")
    values["affected_hosts"] = tuple(hosts)
    placebo = data.get("placebo", False)
    if not isinstance(placebo, bool):
        raise DataError(f"{source}: placebo: expected true or false, got {placebo!r}")
    values["placebo"] = placebo
    try:
        return SwitchbackSchedule(**values)
    except ValueError as exc:
        raise DataError(f"{source}: {exc}") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(data: Mapping[str, Any], key: str, source: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise DataError(f"{source}: {key}: expected an integer, got {value!r}")
    return value


def _ints(data: Mapping[str, Any], key: str, source: str, required: bool = True) -> tuple[int, ...]:
    value = data.get(key, None if required else [])
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise DataError(f"{source}: {key}: expected a list of integers, got {value!r}")
    return tuple(int(v) for v in value)


def min_pairs(alpha: float) -> int:
    """Pairs needed before an exact two-sided randomisation test can reach p < alpha at all."""
    return max(1, math.ceil(math.log2(2.0 / alpha) + 1e-12))
