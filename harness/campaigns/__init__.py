"""Campaigns: many independent jobs (a seed with all its arms, a preset) run by an executor.

``jobs`` names a job and what it returns; ``executors`` runs them here, one after another
(``local``, the default), or as Ray tasks on a cluster (``ray[:ADDRESS]``, the ``ray`` extra),
and gathers what finished, keeping it when the campaign is interrupted.
"""
