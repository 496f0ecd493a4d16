"""rlgauge inside other tools: the pytest plugin, the asv helpers and the in-place ``measure()``."""
