"""The training probe: a real torch.distributed job that records per-rank step times to HDF5."""
