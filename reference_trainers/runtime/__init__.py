"""Where a trainer runs: device resolution and precision, data-parallel processes, the phase probe, and what one
``iterate()`` did."""
