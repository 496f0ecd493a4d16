"""The acting and update paths a trainer composes, each plain path beside its optimised one: acting (per
sub-env or batched, shared by every algorithm), the learner (one
optimiser step), NumPy acting and update, compile and copy helpers, prefetch, training statistics."""
