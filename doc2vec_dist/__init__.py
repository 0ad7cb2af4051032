"""doc2vec-dist: distributed doc2vec (PV-DBOW, dbow_words, PV-DM) on Ray with sharded parameter servers."""

from .runners import calm_openmp_in_ray_workers

__version__ = "0.1.0"

calm_openmp_in_ray_workers()  # before anything in this process imports torch


def __getattr__(name):
    # `from doc2vec_dist import Model` without importing faiss and torch for every CLI command
    if name == "Model":
        from .model import Model

        return Model
    raise AttributeError(name)
