"""The detection matrix: every gate the project ships against every kind of planted regression, k of n.

``plants`` edits a scratch clone into one throwaway commit per kind of regression; ``gates`` runs each gate
on a plant commit against the base and reads its verdict; ``matrix`` runs the grid, resumable, and
renders the table (``rlgauge detection-matrix``, docs/tracking.md).
"""
