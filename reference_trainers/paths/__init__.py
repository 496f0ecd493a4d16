"""The acting and update paths a trainer composes, each plain path beside its optimised one: the learner (one
optimiser step), NumPy acting and update, compile and copy helpers, prefetch, training statistics."""
