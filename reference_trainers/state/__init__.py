"""A trainer's saved state: checkpoint files, trainer and env state, and the atomic file writer."""
