"""doc2vec-dist: distributed doc2vec (PV-DBOW, dbow_words, PV-DM) on Ray with sharded parameter servers."""

import os as _os

__version__ = "0.1.0"


def calm_openmp_in_ray_workers(environ=_os.environ) -> bool:
    """In a Ray worker process (its environment has RAY_RAYLET_PID), OpenMP threads that spin 1,000 times, not
    libgomp's 300,000, before they sleep while they wait, unless the environment chose (OMP_WAIT_POLICY,
    GOMP_SPINCOUNT). Called as the package is imported: a run's actors import it before torch, which loads
    libgomp and reads this once. With the default spin, a worker's torch threads (the token path with the CPU
    as the device, --kernel batched) fight any other busy process for the cores at every parallel step, and
    train many times slower on a shared node (docs/benchmarks.md, "GOMP_SPINCOUNT"). Set in the process, not
    as the actors' runtime_env: that would start each actor in a new process instead of one Ray keeps ready.
    Returns whether it set it."""
    if not environ.get("RAY_RAYLET_PID") or environ.get("OMP_WAIT_POLICY") or environ.get("GOMP_SPINCOUNT"):
        return False
    environ["GOMP_SPINCOUNT"] = "1000"
    return True


calm_openmp_in_ray_workers()


def __getattr__(name):
    # `from doc2vec_dist import Model` without importing faiss and torch for every CLI command
    if name == "Model":
        from .model import Model

        return Model
    raise AttributeError(name)
