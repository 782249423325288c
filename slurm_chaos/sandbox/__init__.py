"""A real multi-node Slurm cluster on one Linux machine, for tests and demonstrations.

slurmctld, slurmdbd and MariaDB run in the root network namespace on a bridge the sandbox
creates; every compute node is one slurmd in its own network, UTS and mount namespace with its
own hostname and address. Each sandbox has a name, so two never share a bridge, namespace,
port or state directory.
"""
