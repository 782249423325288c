"""Commands run on one node of a real cluster, as a one-task job step (the way to reach a node
that the login node cannot ssh into)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_chaos.runner import Completed, Runner


@dataclass
class StepRunner:
    """A Runner that runs every command on one node of a real cluster, as a one-task job step."""

    inner: Runner
    node: str
    options: tuple[str, ...] = ()

    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> Completed:
        head = ["srun", f"--nodelist={self.node}", "--nodes=1", "--ntasks=1", "--quiet", *self.options]
        return self.inner([*head, "--", *argv], timeout=timeout, env=env, input=input)
