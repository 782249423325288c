"""The training probe: a real torch.distributed job that records per-rank step times to HDF5.

``python -m slurm_chaos.probe --steps N --out DIR`` runs one rank (srun starts one per task);
each rank writes ``DIR/rank-<R>.h5`` (layout: :mod:`slurm_chaos.probe.schema`; read it back with
:mod:`slurm_chaos.probe.reader`). Modules, in the order a run uses them: ``cli`` -> ``run`` ->
``rendezvous`` (Slurm / MPI / env), ``workload`` (training or all_reduce sweep), ``telemetry``
(placement, NVML), ``checkpoint`` (background saves, resume), ``writer`` (SWMR HDF5). ``local``
starts ranks on one machine for tests and benchmarks.
"""
