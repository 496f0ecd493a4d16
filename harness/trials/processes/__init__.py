"""An arm's process: the parent's side (``arms``: what to run, started once or served slice after slice), the
child's (``child``: the trainer built with the arm's changes, its maths checked, slices trained on request), and
the warm zygote that forks them (``zygote``)."""
