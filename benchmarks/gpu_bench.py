"""GPU bench: one real worker training on its device against parameter servers held in this process.

What the issue "A GPU-first worker" measures on a GPU machine, which has torch, numpy and pyarrow but
no Ray: the worker of a one-worker run (the URL tables resident on its device, the examples drawn
there, the users' rows streamed from the servers) against ParameterServer objects in this process,
each on a thread of its own (client.LocalServer). It trains --epochs epochs, printing tokens/s and
where the worker's time went for each, then (with --heldout) writes the model directory and scores
held-out recall@10 against the most-popular-URLs baseline, as `evaluate` does.

    python benchmarks/gpu_bench.py --corpus C --heldout H.parquet                        # jobs/configs/gpu.yaml, CUDA
    python benchmarks/gpu_bench.py --corpus C --heldout H.parquet --device cpu --epochs 2  # the same path, CPU as the device
    python benchmarks/gpu_bench.py --corpus C --heldout H.parquet --ray                  # through Ray: `train` itself
    python benchmarks/gpu_bench.py --corpus C --heldout H.parquet --ray --workers 2      # two workers sharing the GPU
    python benchmarks/gpu_bench.py --corpus C --heldout H.parquet --kernel fused         # the fused Triton kernel

With --ray it trains as `doc2vec-dist train` does (trainer.train: the servers and the workers Ray actors on
a local Ray, checkpoints at each epoch's end), the mission's path; each epoch's tokens/s are its wall time's,
its checkpoint apart. --workers W shares the device among W workers (Ray's fractional num_gpus, 1/W each)
on the block schedule; with the CPU as the device, each takes its share of this machine's CPUs.

gensim on the same machine is `doc2vec-dist baseline` (or benchmarks/benchmark.py, which needs Ray), where
Ray and gensim are installed. Figures from --device cpu are the device path's, not a GPU's.
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
from feed_rate import one_worker

from doc2vec_dist.config import TrainConfig, build, load_yaml
from doc2vec_dist.errors import UserError
from doc2vec_dist.logs import to_terminal

DEFAULT_CONFIG = os.path.join(ROOT, "jobs", "configs", "gpu.yaml")


def bench(corpus_path: str, config: TrainConfig, out: str | None, heldout: str | None, overwrite: bool = False) -> dict:
    """Train `config.epochs` epochs of one worker against in-process servers; with `out`, write the
    model there, and with `heldout` score it. Returns the figures."""
    from doc2vec_dist import checkpoint
    from doc2vec_dist.corpus import Corpus

    corpus = Corpus(corpus_path)
    made = checkpoint.start_model_dir(out, corpus.path, overwrite) if out else None
    servers, worker, close = one_worker(corpus_path, config, use_ray=False)
    worker.staged = True  # the device path on the CPU too: its bookkeeping, its 16-bit URL rows (--device-rows)
    epochs, stats_of = [], []
    try:
        for epoch in range(config.epochs):
            t0 = time.perf_counter()
            stats = worker.run_epoch(epoch)
            seconds = time.perf_counter() - t0
            stats_of.append(stats)
            epochs.append({"epoch": epoch + 1, "tokens": stats["tokens"], "seconds": round(seconds, 3),
                           "tokens_per_second": stats["tokens"] / seconds, "loss": stats["loss"] / max(stats["pairs"], 1),
                           "worker_seconds": {k: round(v, 3) for k, v in stats["seconds"].items()}})
            print(f"epoch {epoch + 1}/{config.epochs}: {epochs[-1]['tokens_per_second'] / 1e6:.2f}M tokens/s  "
                  f"loss {epochs[-1]['loss']:.4f}\n    {worker_split(stats['seconds'], digits=2)}", flush=True)
        if out:
            checkpoint.commit_training(out, config, corpus, lambda v: [s.server.save(out, v) for s in servers],
                                       config.epochs, None, stats_of)
            checkpoint.write_config(out, config, corpus.path)
            made = None
    finally:
        close()
        if made is not None:  # stopped before the model was whole: take back what this wrote
            checkpoint.discard_unfinished(out, made)
    tokens = sum(e["tokens"] for e in epochs)
    seconds = sum(e["seconds"] for e in epochs)
    result = {"corpus": corpus.path, "device": str(worker.device), "token_path": worker.token_path,
              "device_rows": str(worker._outputs.dtype).replace("torch.", ""),
              "macro_batch": worker.macro_batch, "config": dataclasses.asdict(config), "epochs": epochs,
              "tokens_per_second": tokens / seconds, "last_epoch_tokens_per_second": epochs[-1]["tokens_per_second"]}
    if out and heldout:
        from doc2vec_dist.evaluate import heldout_metrics

        result["heldout"] = heldout_metrics(out, heldout)
    return result


def bench_ray(corpus_path: str, config: TrainConfig, out: str, heldout: str | None, cuda: bool,
              overwrite: bool = False) -> dict:
    """Train `config` through Ray as `doc2vec-dist train` does (trainer.train, on a local Ray started here
    if none is up), the CPU as the device unless `cuda`; each epoch's tokens/s, and with `heldout`
    the model's recall@10."""
    import ray
    from harness import local_ray

    from doc2vec_dist import settings, trainer

    epochs: list[dict] = []

    def on_epoch(done: int, stats: dict) -> None:
        rate = stats["tokens"] / max(stats["wall_seconds"], 1e-9)
        epochs.append({"epoch": done, "tokens": stats["tokens"], "seconds": round(stats["wall_seconds"], 3),
                       "tokens_per_second": rate, "loss": stats["loss"] / max(stats["pairs"], 1),
                       "worker_seconds": {k: round(v, 3) for k, v in stats["seconds"].items()}})
        print(f"epoch {done}/{config.epochs}: {rate / 1e6:.2f}M tokens/s  loss {epochs[-1]['loss']:.4f}\n    "
              f"{worker_split(stats['seconds'], digits=2)}", flush=True)

    staged = os.environ.get(settings.STAGED_ENV)
    if not cuda:
        os.environ[settings.STAGED_ENV] = "1"  # the driver reads it: its workers run the device path on the CPU
    started = local_ray(max(os.cpu_count() or 1, config.num_workers * config.cpus_per_worker + config.num_ps),
                        logging_level="ERROR", log_to_driver=False)
    try:
        summary = trainer.train(corpus_path, out, config, overwrite=overwrite, on_epoch=on_epoch)
    finally:
        if started:
            ray.shutdown()
        if staged is None:
            os.environ.pop(settings.STAGED_ENV, None)
        else:
            os.environ[settings.STAGED_ENV] = staged
    result = {"corpus": corpus_path, "through": "Ray (trainer.train)", "device": "cuda" if cuda else "cpu",
              "workers": config.num_workers, "gpus_per_worker": config.gpus_per_worker,
              "config": dataclasses.asdict(config), "epochs": epochs,
              "tokens_per_second": summary["tokens_per_second"],
              "last_epoch_tokens_per_second": epochs[-1]["tokens_per_second"],
              "bytes_per_token": summary["bytes_per_token"], "checkpoint_seconds": summary["checkpoint_seconds"]}
    if heldout:
        from doc2vec_dist.evaluate import heldout_metrics

        result["heldout"] = heldout_metrics(out, heldout)
    return result


def main(argv: list[str] | None = None) -> int:
    to_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="a prepared corpus (doc2vec-dist prepare)")
    ap.add_argument("--heldout", help="held-out pairs (prepare --holdout-out): score recall@10 after training")
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="YAML of training flags (default: jobs/configs/gpu.yaml); "
                                                             "one worker is used whatever it says")
    ap.add_argument("--epochs", type=int, default=5, help="epochs (default 5)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="where the worker trains (auto: CUDA if torch sees it, else the CPU as the device)")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "gpu_bench", "model"),
                    help="model directory written for scoring (default runs/gpu_bench/model)")
    ap.add_argument("--overwrite", action="store_true", help="replace a model directory at --out")
    ap.add_argument("--ray", action="store_true",
                    help="train through Ray as `doc2vec-dist train` does (servers and workers Ray actors)")
    ap.add_argument("--workers", type=int, default=1,
                    help="with --ray: workers sharing the device, 1/W of a GPU each, on the block schedule (default 1)")
    ap.add_argument("--kernel", choices=("batched", "fused"), default="batched",
                    help="the device's kernel: batched (torch, the default) or fused (Triton; on the CPU its "
                         "interpreter, slow)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    import torch

    try:
        if args.device == "cuda" and not torch.cuda.is_available():
            raise UserError("--device cuda: torch sees no CUDA device")
        cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        config = build(TrainConfig, load_yaml(args.config) if args.config else {}, {}).validate()
        # the device path whichever the device: the batched kernel (or --kernel fused), the examples drawn where
        # it runs
        every = config.checkpoint_every  # through Ray a run checkpoints as train's would
        config = dataclasses.replace(config, epochs=args.epochs, num_workers=1, progress=False, checkpoint_every=0,
                                     gpus_per_worker=1 if cuda else 0, kernel=args.kernel).validate()
        if args.ray:
            workers = max(1, args.workers)
            # the device shared W ways; with the CPU as the device, this machine's CPUs too
            config = dataclasses.replace(
                config, num_workers=workers, checkpoint_every=every,
                gpus_per_worker=1 / workers if cuda else 0,
                cpus_per_worker=config.cpus_per_worker if cuda else max(1, min(config.cpus_per_worker,
                                                                               (os.cpu_count() or 1) // workers)),
            ).validate()
            result = bench_ray(args.corpus, config, args.out, args.heldout, cuda, overwrite=args.overwrite)
        else:
            result = bench(args.corpus, config, args.out if args.heldout else None, args.heldout, args.overwrite)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.ray:
        print(f"{result['workers']} worker(s) on {result['device']} through Ray: {result['tokens_per_second'] / 1e6:.2f}M "
              f"tokens/s over {args.epochs} epoch(s), {result['last_epoch_tokens_per_second'] / 1e6:.2f}M in the last; "
              f"{sum(result['bytes_per_token'].values()):.1f} bytes a token to and from the servers")
    else:
        path = "the token path: examples drawn on the device" if result["token_path"] else "examples built on the host"
        print(f"one worker on {result['device']} ({path}), macro-batch {result['macro_batch']:,}: "
              f"{result['tokens_per_second'] / 1e6:.2f}M tokens/s over {args.epochs} epoch(s), "
              f"{result['last_epoch_tokens_per_second'] / 1e6:.2f}M in the last")
    if "heldout" in result:
        h = result["heldout"]
        print(f"held-out recall@10 {h['model_recall@10']:.4f} (most popular URLs {h['popularity_recall@10']:.4f}); "
              f"model in {args.out}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
        print(f"saved {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
