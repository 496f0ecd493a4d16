"""PPO: the trainer (``trainer``), its policy and acting (``policy``), its loss (``loss``), its recurrent
variant (``recurrent``); ``python -m reference_trainers.ppo``
trains one from a config file."""
