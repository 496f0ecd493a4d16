"""Replay for the value-based trainers: storages (list, tensor), the PER sampler, transition writers (n-step)."""
