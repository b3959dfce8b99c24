"""Checking and summarising a shard set wherever it lives: the format's checks, fed by storage."""
