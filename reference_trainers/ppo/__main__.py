"""``python -m reference_trainers.ppo --config FILE.yaml``: train PPO on its own, without the harness."""

from reference_trainers.ppo.trainer import main

raise SystemExit(main())
