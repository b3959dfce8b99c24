"""The parts of ``scripts/bench.py``: data, readers, cases, report."""
