"""Specs -> RunResults: the runner, its metrics, the machine state and sentinels around it, interrupts,
progress, provenance and checkpoints."""
