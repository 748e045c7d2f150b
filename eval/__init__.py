"""eval: the benchmarks and the evaluation of prompted and tuned models (`kair eval`, `kair corpus`).
Dataset loaders and specs (datasets.py, specs.py), closed corpora (corpus.py), the KAIR loop and
the baselines as methods (methods.py), answer metrics (metrics.py), the run folder and its
reports (run.py, report.py, table.py). Imports kair_runtime, never the other way."""
