"""Milliseconds per training step of a trained run's own recipe, from its checkpoint.

    taskset -c 0 python benchmarks/bench_step.py runs/mass/best.pt --data data --steps 40
    taskset -c 0 python benchmarks/bench_step.py runs/amass/best.pt --data data --apr --profile

The step is ``masr.train.train_model``'s, driven by its own pieces on the checkpoint's model and
train config: ``_batch_for`` over ``_epoch_order``'s length-sorted batches, ``_step_loss``, the
backward pass, APR's second pass with ``--apr`` (ε and noise from the checkpoint's adversarial
config, else ``AdversarialConfig``'s defaults), and ``LazyAdam``; compiled MASS scores unless
``--eager``; the CLI's allocator settings (``keep_freed_heap``, ``tensor_huge_pages``). Five
warm-up steps (compiling included) are not timed. Both wall and process CPU time are printed:
on a busy or virtual machine the CPU time is the steadier of the two. To compare two versions
of the library, run each in turn several times (``PYTHONPATH=<version>/src``) and compare
medians.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a run's best.pt or last.pt")
    parser.add_argument("--data", type=Path, required=True, help="the run's `masr prep` folder")
    parser.add_argument("--steps", type=int, default=40, help="timed steps (after 5 warm-up)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--apr", action="store_true", help="also APR's second pass (eq. 23)")
    parser.add_argument("--eager", action="store_true", help="no torch.compile of the scores")
    parser.add_argument("--profile", action="store_true", help="torch.profiler table, 10 steps")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--by-name", action="store_true", help="--profile's rows per operator, not per shape"
    )
    args = parser.parse_args(argv)

    import torch

    from masr.adversarial import fast_gradient_deltas, noise_scales, perturbed
    from masr.checkpoint import build_model, load_checkpoint
    from masr.compiled import compile_scores
    from masr.config import AdversarialConfig, TrainConfig
    from masr.dataset import load_prepared
    from masr.sampling import NegativeSampler, TrainingIndex
    from masr.system import keep_freed_heap, tensor_huge_pages
    from masr.train import LazyAdam, _batch_for, _epoch_order, _set_sparse, _step_loss

    keep_freed_heap()
    tensor_huge_pages()
    torch.set_num_threads(args.threads)
    ckpt = load_checkpoint(args.checkpoint)
    data = load_prepared(args.data)
    model = build_model(ckpt).train()
    config = TrainConfig(**ckpt["train_config"])
    adversarial = AdversarialConfig.from_dict(ckpt.get("adversarial") or {})
    _set_sparse(model, config.sparse)
    compiled = compile_scores(model, not args.eager, "cpu")
    generator = torch.Generator()
    generator.manual_seed(config.seed)
    index = TrainingIndex.from_data(data, "cpu")
    sampler = NegativeSampler(index, config.neg_sampler)
    optimizer = LazyAdam(model.parameters(), lr=config.lr)
    if args.apr:  # s(Θ) of eqs. 23-24, once, as train_model does per epoch
        scales = noise_scales(model, adversarial.eps, adversarial.noise)
    order = _epoch_order(model, index.lengths(index.playlist), config, generator, index.playlist)
    n_batches = max(index.n_rows // config.batch_size, 1)

    def step(i: int) -> None:
        start = (i % n_batches) * config.batch_size
        rows = order[start : start + config.batch_size]
        batch = _batch_for(model, index, rows, config, generator)
        loss_of = _step_loss(model, batch, index.song[rows], index, sampler, config, generator)
        optimizer.zero_grad()
        loss_of().backward()
        if args.apr:
            with perturbed(model, fast_gradient_deltas(model, scales)):
                loss_of().backward()
        optimizer.step()
        model.after_step()

    for i in range(5):
        step(i)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(args.steps):
        step(5 + i)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    figures = {
        "checkpoint": str(args.checkpoint),
        "model": model.name,
        "apr": args.apr,
        "compiled": compiled,
        "threads": args.threads,
        "batch_size": config.batch_size,
        "neg": config.neg,
        "loss": config.loss,
        "steps": args.steps,
        "ms_per_step_wall": 1000 * wall / args.steps,
        "ms_per_step_cpu": 1000 * cpu / args.steps,
        "torch": torch.__version__,
    }
    print(
        f"{model.name}{' + APR' if args.apr else ''}: {figures['ms_per_step_wall']:.1f} ms a "
        f"step (wall), {figures['ms_per_step_cpu']:.1f} ms (CPU), {args.steps} steps, "
        f"batch {config.batch_size}, {config.loss} with {config.neg} negatives"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    if args.profile:
        with torch.profiler.profile(record_shapes=True) as prof:
            for i in range(10):
                step(5 + args.steps + i)
        print(
            prof.key_averages(group_by_input_shape=not args.by_name).table(
                sort_by="self_cpu_time_total", row_limit=25
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
