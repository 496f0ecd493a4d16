"""What rlgauge concludes from runs: gates (in-process, across files, across commits), calibration, ablation,
sweeps, the matrix, diagnosis, learning curves, device comparison, memory growth and replay micro-benchmarks."""
