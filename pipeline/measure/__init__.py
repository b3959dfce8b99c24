"""Measuring loaders on the machine at hand: the memory of a process tree, a loader's throughput
in a process of its own, and the search for the loader settings that suit the machine
(:mod:`.tune`). Shared by ``pipeline tune`` and the benchmarks in ``scripts/``."""
