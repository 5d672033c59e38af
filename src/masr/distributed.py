"""Data-parallel training with ``torch.distributed``: the process group, the shards and the
gradient reduction, launched by ``torchrun``.

    torchrun --nproc-per-node 2 -m masr_cli.main train --model amasr --device cpu   # gloo
    torchrun --nproc-per-node 8 -m masr_cli.main train --model amasr --device cuda  # nccl
    torchrun --nnodes 2 --node-rank R --master-addr HOST --nproc-per-node 8 -m masr_cli.main ...

Every rank runs the same ``masr train``: the same seed, so the same initial weights, the same
epoch order, the same batches, the same negatives and member subsets (the sampling generator
stays in step because every rank draws for the whole batch). Rank r then computes the loss of
its shard of the batch, rows r, r + W, r + 2W, ... of the W ranks, and before the optimiser
step the gradients are combined into the whole batch's (``reduce_gradients``): dense ones with
an all-reduce, row-sparse embedding gradients by gathering every rank's rows. So each rank takes
the same optimiser step a single process would take on the whole batch, up to float rounding.
Differences from one process, by design: the dropout masks are drawn per rank (each rank's
global generator is forked from the common one), and APR's perturbation (eq. 24) is computed
from each rank's own shard gradient (the fast-gradient direction of that shard's loss).

Rank 0 does everything visible: validation (its figures are broadcast so every rank takes the
same early-stopping decision), checkpoints, ``run.json``, the run lock, progress and the final
table. Other ranks write nothing.

This module imports torch only inside its functions: ``world()`` is plain Python, so the
torch-free modules that ask it whether to write (``masr.runs.store``) stay torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from masr.errors import MasrError


@dataclass(frozen=True)
class World:
    """Who this process is: ``rank`` of ``size`` processes (one process: 0 of 1)."""

    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


_WORLD = World()


def world() -> World:
    """This process's place in the process group (``World()`` when not distributed)."""
    return _WORLD


def launched() -> bool:
    """True when torchrun (or another launcher) started this process as one of several (a
    malformed $WORLD_SIZE counts as one process)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def init_from_env(device: str) -> World:
    """Join the process group torchrun describes in the environment (WORLD_SIZE, RANK,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT): gloo on CPU, nccl on CUDA (one GPU per local rank).
    Without a launcher: ``World()``."""
    global _WORLD
    if not launched():
        return _WORLD
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        if not torch.cuda.is_available():
            raise MasrError(f"--device {device}: no CUDA device is available on rank {rank}")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        try:
            dist.init_process_group("nccl" if cuda else "gloo")
        except (RuntimeError, ValueError) as exc:
            raise MasrError(
                f"torch.distributed: could not join the process group ({exc})"
            ) from None
    _WORLD = World(rank=dist.get_rank(), size=dist.get_world_size())
    return _WORLD


def shutdown() -> None:
    """Leave the process group (end of ``masr train``)."""
    global _WORLD
    if _WORLD.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    _WORLD = World()


def barrier() -> None:
    """Wait for every rank (a no-op in one process)."""
    if _WORLD.distributed:
        import torch.distributed as dist

        dist.barrier()


def shard(n: int) -> slice:
    """This rank's rows of a batch of ``n`` rows: r, r + W, r + 2W, ..."""
    return slice(_WORLD.rank, n, _WORLD.size)


def from_main(value: Any) -> Any:
    """``value`` as rank 0 has it, on every rank (validation figures; a no-op in one process).
    Goes through torch's in-memory object broadcast; nothing is written."""
    if not _WORLD.distributed:
        return value
    import torch.distributed as dist

    box = [value if _WORLD.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def sum_over_ranks(value: float) -> float:
    """The sum of a number over the ranks (the epoch's loss)."""
    if not _WORLD.distributed:
        return value
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return float(t.item())


def reduce_gradients(params: list[Any], sparse: set[int], n_local: int, n_total: int) -> None:
    """Replace each parameter's gradient (the mean loss over this rank's ``n_local`` rows) by
    the gradient of the mean loss over the whole batch of ``n_total`` rows: Σ_r n_r g_r / n.

    ``sparse`` holds the ids of the parameters whose gradients are row-sparse (embedding
    tables with ``sparse=True``): their (row, values) pairs are gathered from every rank and
    summed, so no rank ever builds a dense table-sized gradient. A parameter without a
    gradient on a rank (an empty shard) contributes zero."""
    import torch
    import torch.distributed as dist

    weight = n_local / n_total
    for p in params:
        if id(p) in sparse:
            _reduce_sparse(p, weight)
            continue
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        grad = grad.mul(weight)
        dist.all_reduce(grad)
        p.grad = grad


def _reduce_sparse(p: Any, weight: float) -> None:
    import torch
    import torch.distributed as dist

    size = _WORLD.size
    if p.grad is not None:
        g = p.grad.coalesce()
        rows, values = g.indices()[0], g.values() * weight
    else:
        rows = torch.zeros(0, dtype=torch.long, device=p.device)
        values = p.new_zeros((0, *p.shape[1:]))
    count = torch.tensor([rows.numel()], dtype=torch.long, device=p.device)
    counts = [torch.zeros_like(count) for _ in range(size)]
    dist.all_gather(counts, count)
    most = int(max(int(c) for c in counts))
    pad = most - rows.numel()
    rows_p = torch.cat([rows, rows.new_zeros(pad)])
    values_p = torch.cat([values, values.new_zeros((pad, *values.shape[1:]))])
    all_rows = [torch.empty_like(rows_p) for _ in range(size)]
    all_values = [torch.empty_like(values_p) for _ in range(size)]
    dist.all_gather(all_rows, rows_p)
    dist.all_gather(all_values, values_p)
    keep = [slice(0, int(c)) for c in counts]
    rows_all = torch.cat([r[k] for r, k in zip(all_rows, keep, strict=True)])
    values_all = torch.cat([v[k] for v, k in zip(all_values, keep, strict=True)])
    # the rows are every rank's rows of this table, valid by construction: opting out of the
    # invariant checks explicitly (they are off by default) keeps PyTorch from warning once
    # per rank
    p.grad = torch.sparse_coo_tensor(
        rows_all.unsqueeze(0), values_all, p.shape, check_invariants=False
    ).coalesce()
