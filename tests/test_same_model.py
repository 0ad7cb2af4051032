"""Issue 49's promise: the redesign trains the same model bit for bit as the code before it, on 1 and 2
workers. The digests in tests/data/same_model.json were written by this file's `__main__` on the commit
it names (before the redesign); a change that moves a bit of either model fails here.

Floating point is the same on the same instruction set, not across them (numba compiles the exact kernel
for the host CPU, torch picks its kernels by the CPU's capability): the digests are kept per CPU, and a
machine whose CPU has none recorded skips the test, saying how to add them (in a checkout of the commit the file names, from
before the redesign: `cd CHECKOUT && PYTHONPATH=. python REPO/tests/test_same_model.py --record`)."""
from __future__ import annotations

import hashlib
import json
import pathlib
import sys

import numpy as np
import pytest

DIGESTS = pathlib.Path(__file__).parent / "data" / "same_model.json"
# the small corpus, 2 epochs, one CPU a worker (a worker of several threads trains them Hogwild: not bit for bit)
RUNS = {"1 worker": {"num_workers": 1, "cpus_per_worker": 1}, "2 workers": {"num_workers": 2, "cpus_per_worker": 1}}
COMMON = {"dim": 16, "epochs": 2, "num_ps": 2, "seed": 7, "checkpoint_every": 0, "progress": False}


def model_digests(corpus: str, out: pathlib.Path) -> dict[str, dict[str, str]]:
    try:
        from doc2vec_dist import modeldir
    except ImportError:  # a checkout from before the redesign (--record): ModelDir was checkpoint's
        from doc2vec_dist import checkpoint as modeldir
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.trainer import train

    found = {}
    for name, settings in RUNS.items():
        model = train(corpus, str(out / name.replace(" ", "-")), TrainConfig(**COMMON, **settings))["model"]
        saved = modeldir.ModelDir(model)
        found[name] = {table: hashlib.sha256(np.ascontiguousarray(saved.read_table(table)).tobytes()).hexdigest()
                       for table in ("docs", "words_out")}
    return found


def capability() -> str:
    """The CPU as the bits see it: LLVM's name for it (numba's target) and torch's capability."""
    import llvmlite.binding
    import torch

    return f"{llvmlite.binding.get_host_cpu_name()}/{torch.backends.cpu.get_cpu_capability()}"


def test_the_same_model_bit_for_bit_as_before_the_redesign(ray_cluster, small_corpus, tmp_path):
    recorded = json.loads(DIGESTS.read_text())
    if capability() not in recorded["by_capability"]:
        pytest.skip(f"no digests for this CPU ({capability()}) in {DIGESTS}: record them in a checkout of "
                    f"{recorded['commit']}: `cd CHECKOUT && PYTHONPATH=. python {__file__} --record`")
    assert model_digests(small_corpus, tmp_path) == recorded["by_capability"][capability()]


if __name__ == "__main__":
    # cd CHECKOUT && PYTHONPATH=. python REPO/tests/test_same_model.py --record: this machine's digests of the
    # package in CHECKOUT, a worktree of the commit the file names (the code before the redesign); from its
    # directory, because Ray's workers import from the driver's working directory
    import subprocess
    import tempfile

    import ray

    import doc2vec_dist

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from conftest import small_corpus

    assert sys.argv[1:] == ["--record"], "usage: cd CHECKOUT && PYTHONPATH=. python REPO/tests/test_same_model.py --record"
    package = pathlib.Path(doc2vec_dist.__file__).parent
    commit = subprocess.run(["git", "-C", str(package), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    recorded = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    if recorded and recorded["commit"] != commit:
        sys.exit(f"{DIGESTS} holds digests of {recorded['commit']}: record with PYTHONPATH naming a checkout of "
                 f"that commit, not of {commit} ({package})")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        factory = type("Factory", (), {"mktemp": lambda self, name: pathlib.Path(tempfile.mkdtemp(dir=tmp))})()
        found = model_digests(small_corpus.__wrapped__(factory), pathlib.Path(tmp))
    recorded = {"commit": commit, "by_capability": {**recorded.get("by_capability", {}), capability(): found}}
    DIGESTS.write_text(json.dumps(recorded, indent=1) + "\n")
    print(json.dumps(found, indent=1))
