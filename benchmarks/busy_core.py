"""What one other busy process costs a run's workers, by how their OpenMP threads wait
(runners.calm_openmp_in_ray_workers):

    python benchmarks/busy_core.py --work /tmp/busy            # the table, and JSON under --work
    python benchmarks/busy_core.py --epochs 8 --repeats 2 --busy 0 1

The bundled sample, one worker of 2 CPUs on the token path with the CPU as the device (settings.STAGED_ENV:
the GPU workers' path, torch's threads), trained with libgomp's default spin (GOMP_SPINCOUNT=300000), the
run's choice (1000: calm_openmp_in_ray_workers) and OMP_WAIT_POLICY=PASSIVE, each next to 0 and 1 processes that keep a core
busy. It prints the median of the runs' training seconds (the summary's train_seconds: the actors' start
and the checkpoints left out). Each run starts its own local Ray with 2 CPUs, as a user's `doc2vec-dist
train` does. Speed needs a quiet machine otherwise: nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from harness import save_json

ONE_RUN = """
import json, os, subprocess, sys
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.trainer import train
from harness import local_ray
corpus, out, epochs, busy = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
local_ray(2, logging_level="ERROR", log_to_driver=False)  # up before the busy processes start
hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(busy)]
try:
    summary = train(corpus, out, TrainConfig(dim=32, epochs=epochs, kernel="batched", progress=False))
finally:
    for hog in hogs:
        hog.kill()
print(json.dumps({"train_seconds": summary["train_seconds"], "tokens": summary.get("tokens")}))
"""

POLICIES = {"default spin (300000)": {"GOMP_SPINCOUNT": "300000"}, "the run's (1000 spins)": {},
            "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="/tmp/busy_core", help="a folder for the corpus, models and JSON")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1], help="how many busy processes beside it")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    corpus = os.path.join(args.work, "corpus")
    if not os.path.exists(corpus):
        subprocess.run([sys.executable, "-m", "doc2vec_dist", "prepare", os.path.join(ROOT, "data", "sample", "events"),
                        "--out", corpus, "--time-col", "ts", "--no-progress"], check=True, cwd=ROOT)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update({"DOC2VEC_DIST_STAGED_ON_CPU": "1", "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "benchmarks")])})
    rows = []
    for busy in args.busy:
        for name, policy in POLICIES.items():
            seconds = []
            for k in range(args.repeats):
                with tempfile.TemporaryDirectory(dir=args.work) as scratch:  # this run's model, removed after
                    done = subprocess.run([sys.executable, "-c", ONE_RUN, corpus, os.path.join(scratch, "model"),
                                           str(args.epochs), str(busy)], env={**env, **policy}, capture_output=True,
                                          text=True, check=False)
                if done.returncode != 0:
                    sys.exit(f"busy_core.py: a run failed ({name}, {busy} busy): {done.stderr[-2000:]}")
                seconds.append(json.loads(done.stdout.strip().splitlines()[-1])["train_seconds"])
            rows.append({"busy": busy, "policy": name, "train_seconds": seconds, "median": statistics.median(seconds)})
            print(f"busy {busy}  {name:<26} train {statistics.median(seconds):7.2f} s  (runs: "
                  + ", ".join(f"{s:.2f}" for s in seconds) + ")", flush=True)
    save_json({"epochs": args.epochs, "repeats": args.repeats, "rows": rows}, os.path.join(args.work, "busy_core.json"))


if __name__ == "__main__":
    main()
