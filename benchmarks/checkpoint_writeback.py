"""What a checkpoint costs the workers: a train run's checkpoints, each timed whole (the workers paused, the
rows they keep written back to the servers, the servers' write and the commit, the workers resumed) and its
save alone (the servers' write and the commit); the difference is the workers' part: on the token path, the
write-back of the documents' rows (and one worker's URL rows) they keep across epochs (Worker.pause), which
trains nothing meanwhile. Issue 48 asks whether that write-back is worth overlapping with training.

    python benchmarks/checkpoint_writeback.py --corpus C --out /tmp/m                      # the GPU path, CPU as device
    python benchmarks/checkpoint_writeback.py --corpus C --out /tmp/m --checkpoint-every 2  # ... and mid-epoch ones

With the CPU as the device (`DOC2VEC_DIST_STAGED_ON_CPU=1`, jobs/configs/gpu.yaml, the batched kernel), as
feed_rate.py --device cpu. Prints one JSON line: per checkpoint, its whole time and its save, their
difference ("workers"); the run's train seconds, tokens/s, and the documents' bytes a write-back carries.
A mid-epoch checkpoint's "workers" also holds the wait for the macro-batch in progress to end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # runs from a checkout without installing the package

from doc2vec_dist import run as run_module
from doc2vec_dist import settings, trainer
from doc2vec_dist.config import TrainConfig, build, load_yaml
from doc2vec_dist.corpus import Corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True, help="the model directory (made here; replaced if it exists)")
    ap.add_argument("--config", default=os.path.join(ROOT, "jobs", "configs", "gpu.yaml"))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--checkpoint-every", type=float, default=600.0)
    args = ap.parse_args()
    os.environ[settings.STAGED_ENV] = "1"  # the GPU worker's path, the CPU as its device
    cfg = build(TrainConfig, load_yaml(args.config), {})
    cfg = dataclasses.replace(cfg, gpus_per_worker=0, kernel="batched", cpus_per_worker=2, epochs=args.epochs,
                              checkpoint_every=args.checkpoint_every, progress=False)
    times: dict[str, list[float]] = {"between_epochs": [], "mid_epoch": [], "save": []}

    workers: list[float] = []  # each pause's time less its save's: the workers' part

    def timed(name: str, original):
        def run(self, *a, **k):
            t0, saved = time.perf_counter(), sum(times["save"])
            try:
                return original(self, *a, **k)
            finally:
                took = time.perf_counter() - t0
                times[name].append(took)
                if name != "save":
                    workers.append(took - (sum(times["save"]) - saved))
        return run

    run_class = run_module.Run
    run_class._checkpoint_between_epochs = timed("between_epochs", run_class._checkpoint_between_epochs)
    run_class._checkpoint_mid_epoch = timed("mid_epoch", run_class._checkpoint_mid_epoch)
    run_class._checkpoint = timed("save", run_class._checkpoint)
    shutil.rmtree(args.out, ignore_errors=True)
    t0 = time.perf_counter()
    s = trainer.train(args.corpus, args.out, cfg)
    wall = time.perf_counter() - t0
    corpus = Corpus(args.corpus)
    print(json.dumps({
        "between_epochs_s": [round(x, 3) for x in times["between_epochs"]],
        "mid_epoch_s": [round(x, 3) for x in times["mid_epoch"]], "save_s": [round(x, 3) for x in times["save"]],
        "workers_part_s": [round(x, 3) for x in workers],
        "documents_bytes": corpus.num_docs * cfg.dim * 4, "train_seconds": round(s["train_seconds"], 2),
        "tokens_per_second": round(s["tokens_per_second"]), "epoch_seconds": round(s["train_seconds"] / args.epochs, 2),
        "wall_s": round(wall, 2), "tokens": s["tokens"]}))


if __name__ == "__main__":
    main()
