"""The probe's work: data-parallel training of a small transformer, or an all_reduce bandwidth sweep.

Training does what DDP does (same initial weights on every rank, gradients averaged over ranks
before each optimizer step) but in the open, so every phase can be timed: forward+backward, then
an explicit all_reduce of the gradients, which live in one flat buffer cut into buckets (the
parameters' ``.grad`` are views into it, as with DDP's ``gradient_as_bucket_view``), then the
optimizer step. On a GPU each phase ends with ``torch.cuda.synchronize`` so its time is the GPU's,
not the launch's. Batches are synthetic tokens drawn from a generator seeded by (seed, rank, step),
so a resumed run sees the same data as an uninterrupted one.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from slurm_chaos.probe.bandwidth import alg_bandwidth, bus_bandwidth


class CollectiveFailed(Exception):
    """A collective raised: a peer died, hung past the timeout, or the network failed.

    gloo and NCCL raise plain RuntimeError; wrapping the collectives alone keeps a failing disk or
    an out-of-memory GPU from being blamed on a peer.
    """


@contextmanager
def collective(what: str) -> Iterator[None]:
    """Turn the RuntimeError of a collective into :class:`CollectiveFailed` naming `what`."""
    try:
        yield
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CollectiveFailed(f"{what}: {first}") from exc


@dataclass(frozen=True)
class ModelSize:
    """Shape of the transformer and its batch."""

    vocab: int
    d_model: int
    heads: int
    layers: int
    seq_len: int
    batch: int


# tiny: a CPU sandbox step in ~20 ms on one core; mini (0.7M parameters): ~30 ms of compute on one
# core, long enough that a switchback block of 10-15 steps outlasts the OS's scheduling jitter;
# small (5M parameters): ~0.9 s on one core, ms on a GPU;
# medium/large: realistic per-GPU loads (about 110M and 350M parameters).
MODEL_SIZES = {
    "tiny": ModelSize(vocab=512, d_model=64, heads=4, layers=2, seq_len=64, batch=8),
    "mini": ModelSize(vocab=1024, d_model=128, heads=4, layers=2, seq_len=128, batch=8),
    "small": ModelSize(vocab=4096, d_model=256, heads=4, layers=4, seq_len=128, batch=16),
    "medium": ModelSize(vocab=32768, d_model=768, heads=12, layers=12, seq_len=512, batch=8),
    "large": ModelSize(vocab=32768, d_model=1024, heads=16, layers=24, seq_len=1024, batch=8),
}


class TinyGPT(nn.Module):
    """A decoder-only transformer: token + position embeddings, causal pre-norm blocks, LM head."""

    def __init__(self, size: ModelSize) -> None:
        super().__init__()
        self.tok = nn.Embedding(size.vocab, size.d_model)
        self.pos = nn.Embedding(size.seq_len, size.d_model)
        layer = nn.TransformerEncoderLayer(
            size.d_model, size.heads, 4 * size.d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, size.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(size.d_model)
        self.head = nn.Linear(size.d_model, size.vocab, bias=False)
        mask = nn.Transformer.generate_square_subsequent_mask(size.seq_len)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.tok(tokens) + self.pos(pos)
        h = self.blocks(h, mask=self.mask, is_causal=True)
        return self.head(self.norm(h))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class StepTimes:
    """Seconds spent in each phase of one step."""

    data: float
    compute: float
    comm: float
    optimizer: float
    loss: float


def _sync_fn(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


class Trainer:
    """One rank's model, optimizer, flat gradient buckets and synthetic data."""

    def __init__(
        self,
        size: ModelSize,
        device: torch.device,
        *,
        seed: int,
        rank: int,
        world_size: int,
        bucket_mb: float = 25.0,
    ) -> None:
        torch.manual_seed(seed)
        self.size = size
        self.device = device
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.model = TinyGPT(size).to(device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        numel = sum(p.numel() for p in self.params)
        self.flat_grad = torch.zeros(numel, device=device, dtype=self.params[0].dtype)
        self._bind_grads()
        self.buckets = self._make_buckets(int(bucket_mb * 2**20) // self.flat_grad.element_size())
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-3)
        self.loss_fn = nn.CrossEntropyLoss()
        self.sync = _sync_fn(device)

    def _bind_grads(self) -> None:
        offset = 0
        for p in self.params:
            p.grad = self.flat_grad[offset : offset + p.numel()].view_as(p)
            offset += p.numel()

    def _make_buckets(self, bucket_elems: int) -> list[torch.Tensor]:
        # Parameters are laid out in registration order; gradients arrive roughly in reverse.
        n = self.flat_grad.numel()
        bounds = [*range(0, n, max(1, bucket_elems)), n]
        return [self.flat_grad[a:b] for a, b in itertools.pairwise(bounds)][::-1]

    @property
    def numel(self) -> int:
        return self.flat_grad.numel()

    def broadcast_parameters(self) -> None:
        """Make every rank start from rank 0's weights, as DDP does at construction."""
        if self.world_size > 1:
            with collective("broadcast of the initial weights"):
                for t in self.model.state_dict().values():
                    dist.broadcast(t, src=0)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Synthetic tokens for (rank, step): the input and its next-token targets."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rank * 7919 + step)
        s = self.size
        tokens = torch.randint(0, s.vocab, (s.batch, s.seq_len + 1), generator=g)
        tokens = tokens.to(self.device, non_blocking=True)
        return tokens[:, :-1], tokens[:, 1:]

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.flat_grad.zero_()
        logits = self.model(x)
        loss: torch.Tensor = self.loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    def allreduce_gradients(self) -> None:
        """Average the gradients over ranks, bucket by bucket (all buckets in flight at once)."""
        if self.world_size == 1:
            return
        with collective("gradient all_reduce"):
            works = [dist.all_reduce(b, async_op=True) for b in self.buckets]
            for w in works:
                w.wait()
        self.flat_grad.div_(self.world_size)

    def step(self, step: int) -> StepTimes:
        """One timed training step."""
        t0 = time.perf_counter()
        x, y = self.batch(step)
        self.sync()
        t1 = time.perf_counter()
        loss = self._forward_backward(x, y)
        self.sync()
        t2 = time.perf_counter()
        self.allreduce_gradients()
        self.sync()
        t3 = time.perf_counter()
        self.optimizer.step()
        self.sync()
        t4 = time.perf_counter()
        return StepTimes(t1 - t0, t2 - t1, t3 - t2, t4 - t3, float(loss.detach()))

    def step_untimed(self, step: int) -> None:
        """The same step with no timers or syncs: the baseline the instrumentation is measured against."""
        x, y = self.batch(step)
        self._forward_backward(x, y)
        self.allreduce_gradients()
        self.optimizer.step()

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._bind_grads()

    def checksum(self) -> float:
        """Sum of all weights: equal on every rank when data parallelism is doing its job."""
        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.params))


@dataclass(frozen=True)
class AllreduceResult:
    """One message size of the sweep: median time per all_reduce and nccl-tests' bandwidths."""

    size_bytes: int
    time: float
    algbw: float
    busbw: float
    iteration_times: tuple[float, ...]


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two from `min_bytes` to `max_bytes` (both rounded to a power of two, at least 4 B)."""
    lo = max(2, math.ceil(math.log2(max(4, min_bytes))))
    hi = max(lo, math.floor(math.log2(max(4, max_bytes))))
    return [2**e for e in range(lo, hi + 1)]


def allreduce_size(
    nbytes: int, iters: int, warmup: int, device: torch.device, world_size: int
) -> AllreduceResult:
    """Time `iters` float32 all_reduces of `nbytes` each, after `warmup` untimed ones."""
    sync = _sync_fn(device)
    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    times = []
    with collective(f"all_reduce of {nbytes} B"):
        for _ in range(warmup):
            dist.all_reduce(buf)
        sync()
        for _ in range(iters):
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            sync()
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    algbw = alg_bandwidth(nbytes, median)
    return AllreduceResult(nbytes, median, algbw, bus_bandwidth(algbw, world_size), tuple(times))
