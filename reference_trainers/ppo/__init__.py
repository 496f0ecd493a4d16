"""PPO: the trainer (``trainer``), its recurrent variant (``recurrent``); ``python -m reference_trainers.ppo``
trains one from a config file."""
