"""doc2vec-dist: distributed doc2vec (PV-DBOW) training on Ray with sharded parameter servers."""

__version__ = "0.1.0"
