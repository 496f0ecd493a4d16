"""Value-based trainers: DQN (``dqn``), IQN (``iqn``) and the loop they share (``loop``)."""
