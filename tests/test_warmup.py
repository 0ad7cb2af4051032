"""A fresh install's numba cache is cold: its first local run compiles the kernels beside Ray's start
(doc2vec_dist/warmup.py), and its workers and servers then compile none of them in training."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# each kernel a default run calls first, with the signatures numba's cache holds for it
SIGNATURES = """
import json
from doc2vec_dist import warmup
from types import SimpleNamespace
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.settings import resolve
run = resolve(TrainConfig(), SimpleNamespace(num_tokens=50_000, vocab_size=5000, meta={}))
print(json.dumps({f.__name__: sorted(str(key[0]) for key in f._cache._cache_file._load_index())
                  for f in warmup.kernels(run)}))
"""


def _python(code_or_args: list[str], cache: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, *code_or_args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout, check=False)


def test_a_cold_cache_is_filled_beside_the_start_with_what_the_run_calls(small_corpus, tmp_path):
    from doc2vec_dist.config import TrainConfig

    cold = str(tmp_path / "cache-run")
    done = _python(["-m", "doc2vec_dist", "train", "--corpus", small_corpus, "--out", str(tmp_path / "m"),
                    "--epochs", "1", "--dim", "8", "--no-progress"], cold)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "numba: compiled the kernels for this install in" in done.stderr, done.stderr[-3000:]
    after_run = json.loads(_python(["-c", SIGNATURES], cold).stdout)
    # what the compiling process alone caches: the run's actors added no signature of their own
    alone = str(tmp_path / "cache-alone")
    settings = {**dataclasses.asdict(TrainConfig()), "token_path": True, "exact": True}
    assert _python(["-m", "doc2vec_dist.warmup", json.dumps(settings)], alone).returncode == 0
    assert json.loads(_python(["-c", SIGNATURES], alone).stdout) == after_run
    assert all(after_run.values()), after_run
    # and a warm cache starts nothing
    probe = SIGNATURES.split("print(")[0] + "print(warmup.cold(run))"
    assert _python(["-c", probe], cold).stdout.strip() == "False"
    assert _python(["-c", probe], str(tmp_path / "cache-empty")).stdout.strip() == "True"
