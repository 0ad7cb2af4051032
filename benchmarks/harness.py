"""What the ours-against-gensim scripts share: one local Ray for a script's runs, and one way to read
gensim's Lee corpus (the 50 test and 300 background news documents, and the human ratings of the test
documents' pairs), so that every script scores Lee on the same text."""

from __future__ import annotations

import json
import os


def local_ray(cpus: int, logging_level: str = "WARNING", **kwargs) -> bool:
    """Start a local Ray of `cpus` logical CPUs for a script's runs (each train() would otherwise start
    its own), with the object store train() gives a local Ray. A Ray already up is used as it is: True
    only when this call started one, which the caller then shuts down."""
    import ray

    from doc2vec_dist.cluster import local_object_store_bytes

    if ray.is_initialized():
        return False
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging_level,
             **{"object_store_memory": local_object_store_bytes(), **kwargs})
    return True


def save_json(result: dict, path: str, say: bool = True) -> None:
    """A script's figures as JSON at `path`, and (say) the line that says where."""
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
    if say:
        print(f"saved {path}")


def lee_documents() -> dict[str, list[str]]:
    """Lee's test and background documents, one string of gensim's simple_preprocess tokens each."""
    from gensim.test.utils import datapath
    from gensim.utils import simple_preprocess

    parts = {}
    for part, name in (("test", "lee.cor"), ("background", "lee_background.cor")):
        with open(datapath(name), encoding="latin-1") as fh:
            parts[part] = [" ".join(simple_preprocess(line)) for line in fh]
    return parts


def lee_ratings_path() -> str:
    """The 50 × 50 matrix of human similarity ratings of the test documents."""
    from gensim.test.utils import datapath

    return datapath("similarities0-1.txt")


def write_lee_text(path: str, background_first: bool = False) -> int:
    """Lee as a text corpus, one document per line; returns the line of the first test document (its
    key), 0 when the test documents come first."""
    parts = lee_documents()
    order = ("background", "test") if background_first else ("test", "background")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(line + "\n" for part in order for line in parts[part])
    return len(parts["background"]) if background_first else 0
