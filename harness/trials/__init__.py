"""``rlgauge try``: the changes a diagnosis points to, each applied to a user's trainer without editing
its code, measured against the unchanged trainer in fresh processes, and checked for what it does to
the maths.

- ``catalogue``: the changes (runtime or source), what each does to the maths, which finding selects it;
- ``plan``: the candidates for one diagnosis (or ``--only``);
- ``source_edits``: edits at the lines the diagnosis found, made on copies of the user's files;
- ``runtime_patches``: the runtime changes, applied in the child process around the factory;
- ``processes``: one arm in a fresh process (``child``: a parity run, or a live process that trains slice by
  slice), the parent's side (``arms``: timeouts, heartbeats) and the warm zygote that forks them (``zygote``);
- ``seeding``: where a trainer's randomness escapes its seed, for a "not reproducible" verdict's fix;
- ``parity``: the state after N ``iterate()`` calls compared (parameters, buffers, optimizer state, NaN/Inf
  places); ``rounds``: one value a round, intervals over rounds, verdicts; ``slices``: the alternating slices;
- ``session``: the whole try; ``patch_file`` and ``report``: the diff, the table and the JSON.
"""
