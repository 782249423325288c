"""What a node's GPU tools print, as records: nvidia-smi (``nvsmi``), the GPU numbering of Slurm,
the driver, NVML and DCGM (``numbering``), and whether a clock lock or a power cap shows on the GPU
(``readback``). Pure text -> data, tested against real GPUs' output (``../shared/data/gpu-captures``);
the commands themselves run where the caller's runner runs them.
"""
