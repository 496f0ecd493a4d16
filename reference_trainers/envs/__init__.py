"""Environments: construction and the vector backends (serial, async, EnvPool), Atari, partially observed
tasks, episode tracking."""
