"""Reading shards into PyTorch: the epoch plan, the dataset, the loader."""
