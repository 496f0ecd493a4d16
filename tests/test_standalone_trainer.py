"""The reference trainers run on their own, without the harness."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import TINY


@pytest.mark.parametrize("recurrent", ["none", "gru"])
def test_ppo_module_trains_from_a_yaml_config(tmp_path: Path, recurrent: str) -> None:
    config = tmp_path / "cartpole.yaml"
    config.write_text(yaml.safe_dump({"env": {"id": "CartPole-v1"}, "device": "cpu", "model": {"recurrent": recurrent}}))
    args = [sys.executable, "-m", "reference_trainers.ppo.trainer", "--config", str(config), "--steps", "64"]
    for override in TINY:
        args += ["--set", override]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("env_steps=")]
    assert lines and int(lines[-1].split()[0].split("=")[1]) >= 64


def test_trainers_do_not_import_the_harness() -> None:
    code = "import sys, reference_trainers.ppo.trainer; print(any(m.split('.')[0] == 'harness' for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
