"""The statistics of comparisons: intervals and ratios, power, result quality and parity classes."""
