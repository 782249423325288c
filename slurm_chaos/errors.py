"""Exceptions that carry the process exit code the CLI returns for them.

0 success, 1 findings (a verdict other than PASSED, an audit that found problems), 2 bad input
(UsageError, DataError), 3 the tool itself failed (SlurmError: Slurm unreachable or refusing a
request), 130 interrupted (the CLI's, not an exception's).
"""

from __future__ import annotations


class ChaosError(Exception):
    """A failure the user can act on; the CLI prints the message, no traceback."""

    exit_code = 1


class UsageError(ChaosError):
    """Bad input (config file, option, experiment name): nothing was changed."""

    exit_code = 2


class ConfigError(UsageError):
    """A site config or experiment file is invalid; the message names file and key."""

    def __init__(self, path: str, key: str, problem: str) -> None:
        self.path = path
        self.key = key
        self.problem = problem
        super().__init__(f"{path}: {key or '<top level>'}: {problem}")


class SlurmError(ChaosError):
    """Slurm refused a request or could not be reached; carries Slurm's own message.

    Exit 3: the tool could not do its work, which is neither a finding (1) nor bad input (2).
    """

    exit_code = 3


class SlurmUnreachable(SlurmError):
    """slurmctld did not answer within the timeout."""


class DataError(ChaosError):
    """Probe output is missing, truncated or inconsistent."""

    exit_code = 2
