"""Value-based trainers: DQN (``dqn``), IQN (``iqn``), the loop they share (``loop``) and their
epsilon-greedy acting (``acting``)."""
