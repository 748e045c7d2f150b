"""kair_runtime: the KAIR loop (iterative retrieval with an evolving index), shared by data_gen,
train, eval and serve. Nothing here imports those packages, and importing it loads no model."""

__version__ = "0.1.0"
