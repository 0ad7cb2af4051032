"""Feed rate: the tokens/s one worker's CPU side can deliver, with the kernel and without it.

A GPU worker is bounded by the CPU work around its micro-batches: reading its shard, building the
examples, pulling and pushing rows. This job runs one real worker in this process against real
parameter-server actors on a local Ray, first with the kernel replaced by nothing (the rate at which
a device could be fed, however fast), then with the real kernel on the config's device (CUDA with
--gpus-per-worker > 0). It prints tokens/s and where the worker's time went for each. Every run
trains --epochs epochs and is timed on the last: the first pays for starting the servers and the
first pulls.

    python benchmarks/feed_rate.py --corpus CORPUS                                      # the defaults: exact CPU kernel
    python benchmarks/feed_rate.py --corpus CORPUS --config jobs/configs/gpu.yaml       # on a GPU machine
    python benchmarks/feed_rate.py --corpus CORPUS --config jobs/configs/gpu.yaml --no-ray   # ... without Ray
    python benchmarks/feed_rate.py --corpus CORPUS --config jobs/configs/gpu.yaml --device cpu   # no GPU: the CPU as the device

With --no-ray the servers are ParameterServer objects in this process, each on a thread of its own
(client.LocalServer): what the host side costs without Ray's object store, and a run on a machine
that has no Ray. On the token path "nothing" also replaces drawing the examples on the device.
With --device cpu the worker runs the GPU worker's path (the batched kernel, its rows staged on a device)
with the CPU as the device, as `DOC2VEC_DIST_STAGED_ON_CPU=1` runs it under `train`: that path's host
side, measured where there is no GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # runs from a checkout without installing the package
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from benchmark import worker_split

from doc2vec_dist.config import TrainConfig, build, load_yaml
from doc2vec_dist.errors import UserError
from doc2vec_dist.logs import to_terminal
from doc2vec_dist.settings import resolve


def one_worker(corpus_path: str, config: TrainConfig, use_ray: bool = True, compute=None, staged: bool | None = None):
    """Parameter servers for `corpus_path` and the real worker 0 of a one-worker run against them:
    (servers, worker, close). The servers are Ray actors, or (use_ray False) ParameterServer objects
    in this process, each on a thread of its own (client.LocalServer). compute: units.Compute (None:
    the real kernels). staged: whether the worker runs the device path (None: where it has a GPU)."""
    from doc2vec_dist import client, units
    from doc2vec_dist import worker as worker_mod
    from doc2vec_dist.corpus import Corpus
    from doc2vec_dist.ps import ParameterServer, table_specs

    corpus = Corpus(corpus_path)
    tables = table_specs(config, corpus)
    if use_ray:
        import ray

        server_cls = ray.remote(ParameterServer)
        servers = [server_cls.options(max_concurrency=4).remote(s, config.num_ps, tables, config.seed,
                                                                rounding=config.rounding)
                   for s in range(config.num_ps)]
    else:
        servers = [client.LocalServer(ParameterServer(s, config.num_ps, tables, config.seed, rounding=config.rounding))
                   for s in range(config.num_ps)]

    def close():
        for server in servers:
            if use_ray:
                ray.kill(server)
            else:
                server.close()

    try:
        settings = dataclasses.replace(resolve(config, corpus), staged=staged)
        worker = worker_mod.Worker(0, units.plan_units(corpus, 1)[0], corpus.path, settings, servers, tables,
                                   compute=compute)
    except BaseException:
        close()
        raise
    return servers, worker, close


def feed(corpus_path: str, config: TrainConfig, kernel: bool, use_ray: bool = True, timed: int = 1,
         staged: bool | None = None) -> dict:
    """One worker's last `timed` epochs of `config.epochs` (more than `timed`: the first pulls the URL
    rows), with the real kernel or with none; its servers Ray actors, or (use_ray False)
    ParameterServer objects in this process, each on a thread of its own. staged: as one_worker.

    The worker runs them as epochs of a longer run: the end of a run's last epoch, and each checkpoint,
    write back the rows a worker keeps resident across epochs (RunSettings.writes_back_at_end_of), which is a
    checkpoint's work, on its clock. That write-back is timed apart, after the timed epochs, as a
    checkpoint's pause makes it ("write_back_seconds", and its bytes)."""
    from doc2vec_dist import units

    # every kernel (batched, exact, exact drawing its own examples) and the device's example drawing
    nothing = units.Compute(batched=lambda *args, **kwargs: 0.0, exact=lambda *args, **kwargs: 0.0,
                            tokens=lambda *args, **kwargs: (0.0, 0), device_examples=_no_examples)
    longer = dataclasses.replace(config, epochs=config.epochs + 1)  # the timed epochs are not the run's last
    _, worker, close = one_worker(corpus_path, longer, use_ray, compute=None if kernel else nothing, staged=staged)
    first = config.epochs - timed
    assert first >= 1, "the timed epochs follow at least one"
    tokens, seconds, split, moved = 0, 0.0, {}, {}
    try:
        for epoch in range(first):
            worker.run_epoch(epoch)
        for epoch in range(first, config.epochs):
            t0 = time.perf_counter()
            stats = worker.run_epoch(epoch)
            seconds += time.perf_counter() - t0
            tokens += stats["tokens"]
            split = {k: split.get(k, 0.0) + v for k, v in stats["seconds"].items()}
            moved = {k: moved.get(k, 0) + v for k, v in stats["bytes"].items()}
        t0 = time.perf_counter()
        worker.pause()  # idle: what a checkpoint's pause writes back
        write_back = time.perf_counter() - t0
        worker.resume()
        written = sum(worker.progress()["bytes"].values())
    finally:
        close()
    return {"kernel": kernel, "servers": "Ray actors" if use_ray else "in this process", "device": str(worker.device),
            "staged": bool(worker.staged),
            "tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_second": tokens / seconds, "macro_batch": worker.macro_batch,
            "worker_seconds": {k: round(v, 3) for k, v in split.items()},
            "bytes_per_token": {k: round(v / max(tokens, 1), 2) for k, v in moved.items()},
            "write_back_seconds": round(write_back, 3), "write_back_bytes": written}


def _no_examples(doc_rows, offsets, tokens, tables, negative, gen, micro_batch, shape=None):
    """device_examples.build, by nothing: drawing the token path's examples is the device's work."""
    from doc2vec_dist.device_examples import DeviceExamples

    empty = tokens[:0].long()
    return DeviceExamples(ctx=empty[:, None], target=empty, neg=empty.view(0, 0), neg_mask=empty.view(0, 0) > 0,
                          micro_batch=1)


def line(r: dict) -> str:
    parts = worker_split(r["worker_seconds"], digits=2)
    what = "kernel on " + r["device"] if r["kernel"] else "no kernel (the feed ceiling)"
    moved = sum(r["bytes_per_token"].values())
    return (f"{what:<30} {r['tokens_per_second'] / 1e6:6.2f}M tokens/s  ({r['tokens']:,} tokens in "
            f"{r['seconds']:.2f}s; {moved:.1f} bytes a token to and from the servers)\n    {parts}\n"
            f"    a checkpoint's write-back of the rows kept resident: {r['write_back_seconds']:.2f}s, "
            f"{r['write_back_bytes'] / 2**20:.1f} MiB")


def main(argv: list[str] | None = None) -> int:
    to_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="a prepared corpus (doc2vec-dist prepare)")
    ap.add_argument("--config", help="YAML of training flags (one worker is used whatever it says)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per run, timed on the last (default 2)")
    ap.add_argument("--num-ps", type=int, help="parameter servers (default: the config's)")
    ap.add_argument("--no-kernel-only", action="store_true", help="only the run without the kernel")
    ap.add_argument("--no-ray", action="store_true",
                    help="servers as objects in this process, each on a thread of its own: no Ray needed")
    ap.add_argument("--device", choices=("config", "cuda", "cpu"), default="config",
                    help="where the worker computes: as the config says (a GPU where gpus_per_worker > 0), on CUDA, "
                         "or the GPU worker's path with the CPU as the device (default: config)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    try:
        config = build(TrainConfig, load_yaml(args.config) if args.config else {},
                       {"num_ps": args.num_ps}).validate()
        config = dataclasses.replace(config, epochs=args.epochs, num_workers=1, progress=False)
        staged = None
        if args.device != "config":  # the device path whichever the device: the batched kernel, staged
            config = dataclasses.replace(config, gpus_per_worker=1 if args.device == "cuda" else 0,
                                         kernel="batched").validate()
            staged = True
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.no_ray:
        ray = None
        started_here = False
    else:
        import ray

        started_here = not ray.is_initialized()
    if started_here:
        from harness import local_ray

        local_ray(max(os.cpu_count() or 1, config.num_ps + 1), logging_level="ERROR", log_to_driver=False)
    try:
        runs = [feed(args.corpus, config, kernel, use_ray=not args.no_ray, staged=staged)
                for kernel in ((False,) if args.no_kernel_only else (False, True))]
    except RuntimeError as exc:  # e.g. --gpus-per-worker on a machine without CUDA
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if started_here:
            ray.shutdown()
    print(f"feed rate of one worker: {args.corpus}, macro-batch {runs[0]['macro_batch']:,} tokens, "
          f"{config.num_ps} PS ({runs[0]['servers']}), epoch {config.epochs} of {config.epochs}")
    for r in runs:
        print(line(r))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"corpus": args.corpus, "config": dataclasses.asdict(config), "runs": runs}, fh, indent=2)
        print(f"saved {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
