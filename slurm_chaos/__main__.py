"""`python -m slurm_chaos` is the `slurm-chaos` command."""

import sys

from slurm_chaos.cli import main

sys.exit(main())
