"""The tool's one home of statistics: bootstrap intervals of ratios (``intervals``), learning statistics over
seeds through rliable (``learning``), verdicts with margins (``verdicts``), power, comparisons, result quality
and parity classes."""
