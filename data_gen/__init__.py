"""data_gen: KAIR training data. Teacher trajectories from any backend (`kair datagen generate`,
teacher.py) or silver ones built from the benchmarks' gold chains (silver.py, chains.py), the
answer-F1 filter that keeps the good ones (filter.py), and their conversion to chat SFT data
(sft.py); store.py reads and writes trajectories. Imports kair_runtime, never the other way."""
