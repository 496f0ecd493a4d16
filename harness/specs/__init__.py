"""What to measure: the shipped presets and their YAML, users' own trainers, peer libraries, run sizes."""
