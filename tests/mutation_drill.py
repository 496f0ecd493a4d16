"""Mutation drill: plant one bug at a time in a copy of the project and check that the tests catch it.

Each mutant makes one registry flag a silent no-op where the trainers read it (runs still
complete, the resolved config still says the flag is on), swaps a vectorisation mode, or
breaks the maths under a reduced-precision mode. For each, the tests that should catch it
run in the copy: the flag's effect tests (``--effects-of KEY``) or the named test files.

    .venv/bin/python tests/mutation_drill.py [--only NAME_OR_KEY ...] [--list]

Prints one line per mutant (killed / SURVIVED, with seconds) and exits 1 if any survived.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    key: str
    """The registry flag it attacks (its effect tests run unless ``tests`` names others)."""
    path: str
    old: str
    """Text that must occur exactly once in ``path``."""
    new: str
    tests: tuple[str, ...] = field(default=())
    """pytest arguments selecting the tests that must catch it (default: ``--effects-of key``)."""


def _o(name: str) -> str:
    return f"optimizations.{name}"


PROPERTIES = ("tests/properties/test_checks_can_fail.py", "tests/properties/test_parity_properties.py", "-k",
              "reduced_precision")

MUTANTS: tuple[Mutant, ...] = (
    # vectorisation modes swapped: the mode says sync/native, the loop is serial
    Mutant("sync-builds-serial", "env.vectorization", "reference_trainers/envs/factory.py",
           "    if mode == \"serial\":\n        return SerialVectorEnv(env_fns)",
           "    if mode in (\"serial\", \"sync\"):\n        return SerialVectorEnv(env_fns)"),
    Mutant("native-builds-sync", "env.vectorization", "reference_trainers/envs/factory.py",
           "    if mode == \"native\":\n", "    if mode == \"native-off\":\n"),
    Mutant("async-builds-sync", "env.vectorization", "reference_trainers/envs/factory.py",
           "    return CheckedAsyncVectorEnv(env_fns, env_id)",
           "    return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.NEXT_STEP)"),
    # process-wide settings never applied while a trainer runs
    Mutant("threads-never-applied", _o("torch_threads"), "reference_trainers/paths/learner.py",
           "    dev.apply_threads(optimizations.torch_threads)\n", ""),
    Mutant("precision-never-applied", _o("matmul_precision"), "reference_trainers/paths/learner.py",
           "    dev.apply_precision(optimizations.matmul_precision, optimizations.tf32)\n", ""),
    Mutant("amp-never-autocasts", _o("amp"), "reference_trainers/paths/learner.py",
           "self.amp, self.amp_dtype = bool(o.amp), dev.amp_dtype(config)",
           "self.amp, self.amp_dtype = False, dev.amp_dtype(config)"),
    # torch.compile never called
    Mutant("compile-never-called", _o("compile_train_step"), "reference_trainers/paths/speedups.py",
           "self._call = torch.compile(fn, **compile_kwargs)", "self._call = fn"),
    Mutant("compile-model-eager", _o("compile_model"), "reference_trainers/paths/speedups.py",
           "self._call = torch.compile(fn, **compile_kwargs)", "self._call = fn"),
    # the learner
    Mutant("optimizer-always-forloop", _o("optimizer_impl"), "reference_trainers/paths/learner.py",
           "make_adam(model.parameters(), lr, adam_eps, o.optimizer_impl,",
           "make_adam(model.parameters(), lr, adam_eps, \"forloop\","),
    Mutant("foreach-clip-ignored", _o("foreach_grad_clip"), "reference_trainers/paths/learner.py",
           "self.foreach_clip = bool(o.foreach_grad_clip)", "self.foreach_clip = False"),
    Mutant("direct-adam-ignored", _o("direct_adam_step"), "reference_trainers/paths/learner.py",
           "FusedAdamStep(self.optimizer) if o.direct_adam_step else None", "None"),
    Mutant("sync-free-logging-ignored", _o("sync_free_logging"), "reference_trainers/paths/learner.py",
           "make_stats(o.sync_free_logging, device)", "make_stats(False, device)"),
    # value-based trainers
    Mutant("dqn-num-workers-inline", _o("num_workers"), "reference_trainers/value/loop.py",
           "self.prefetcher = Prefetcher(o.num_workers)", "self.prefetcher = Prefetcher(0)"),
    Mutant("replay-always-list", _o("replay"), "reference_trainers/value/loop.py",
           "make_replay(o.replay,", "make_replay(\"list\","),
    Mutant("dqn-numpy-acting-ignored", _o("numpy_acting"), "reference_trainers/value/loop.py",
           "        if o.numpy_acting:\n            block = c.tuning", "        if False:\n            block = c.tuning"),
    Mutant("dqn-numpy-update-ignored", _o("numpy_update"), "reference_trainers/value/updates.py",
           "    if o.numpy_update:\n        return NumpyUpdate(trainer)", "    if False:\n        return NumpyUpdate(trainer)"),
    Mutant("dqn-host-gather-ignored", _o("numpy_update"), "reference_trainers/value/updates.py",
           "    sets_grads = True\n    host_minibatches = True", "    sets_grads = True\n    host_minibatches = False"),
    Mutant("numpy-dqn-huber-unclipped", _o("numpy_update"), "reference_trainers/paths/numpy_update.py",
           "slope = np.clip(error, -1.0, 1.0) / count", "slope = error / count",
           tests=("tests/test_numpy_update.py",)),
    Mutant("dqn-analytic-grads-ignored", _o("analytic_grads"), "reference_trainers/value/updates.py",
           "    if o.analytic_grads:\n        return HandWrittenUpdate", "    if False:\n        return HandWrittenUpdate"),
    Mutant("dqn-uint8-transfer-ignored", _o("uint8_transfer"), "reference_trainers/value/loop.py",
           "uint8=bool(o.uint8_transfer))", "uint8=False)"),
    Mutant("gather-in-step-ignored", _o("gather_in_step"), "reference_trainers/value/updates.py",
           "gathers_in_step=bool(o.gather_in_step))", "gathers_in_step=False)"),
    Mutant("cpp-wrapper-ignored", _o("compile_cpp_wrapper"), "reference_trainers/value/updates.py",
           "cpp_wrapper=bool(o.compile_cpp_wrapper),", "cpp_wrapper=False,"),
    Mutant("block-noise-ignored", _o("block_noise"), "reference_trainers/value/loop.py",
           "block = c.tuning.noise_block_steps if o.block_noise else 1", "block = 1"),
    Mutant("replay-direct-write-ignored", _o("replay_direct_write"), "reference_trainers/value/loop.py",
           "self.direct_write = bool(o.replay_direct_write)", "self.direct_write = False"),
    Mutant("aten-tanh-ignored", _o("aten_tanh"), "reference_trainers/nets/mlp.py",
           "def aten_tanh_from(config: TrainConfig) -> int | None:",
           "def aten_tanh_from(config: TrainConfig) -> int | None:\n    return None\n\n\ndef _unused(config: TrainConfig) -> int | None:"),
    # PPO
    Mutant("ppo-num-workers-inline", _o("num_workers"), "reference_trainers/ppo/trainer.py",
           "self.prefetcher = Prefetcher(o.num_workers)", "self.prefetcher = Prefetcher(0)"),
    Mutant("batch-inference-ignored", _o("batch_inference"), "reference_trainers/paths/acting.py",
           "    if batch_inference:\n", "    if False:\n"),
    Mutant("inference-batch-size-ignored", _o("inference_batch_size"), "reference_trainers/paths/numpy_acting.py",
           "return (inference_batch_size or num_envs) if batch_inference else 1",
           "return num_envs if batch_inference else 1"),
    Mutant("ppo-numpy-acting-ignored", _o("numpy_acting"), "reference_trainers/ppo/trainer.py",
           "                           if o.numpy_acting else None)", "                           if False else None)"),
    Mutant("ppo-analytic-grads-ignored", _o("analytic_grads"), "reference_trainers/ppo/updates.py",
           "    if o.analytic_grads:\n        return HandWrittenUpdate", "    if False:\n        return HandWrittenUpdate"),
    Mutant("ppo-block-noise-ignored", _o("block_noise"), "reference_trainers/ppo/trainer.py",
           "block_noise=bool(o.block_noise))", "block_noise=False)"),
    Mutant("ppo-numpy-update-ignored", _o("numpy_update"), "reference_trainers/ppo/updates.py",
           "    if o.numpy_update:\n        return NumpyUpdate(trainer)", "    if False:\n        return NumpyUpdate(trainer)"),
    Mutant("numpy-update-population-std", _o("numpy_update"), "reference_trainers/ppo/loss.py",
           "max(count - 1, np.float32(1.0))", "count", tests=("tests/test_numpy_update.py",)),
    Mutant("numpy-column-sums-halved", _o("numpy_update"), "reference_trainers/paths/numpy_acting.py",
           "return np.matmul(_filled((len(a),), 1.0, a.dtype), a, out=out)",
           "return np.matmul(_filled((len(a),), 0.5, a.dtype), a, out=out)",
           tests=("tests/test_numpy_update.py", "tests/test_numpy_acting.py")),
    Mutant("numpy-relu-no-op", _o("numpy_update"), "reference_trainers/paths/numpy_acting.py",
           "np.maximum(x, _filled(x.shape, 0.0), out=x)", "np.maximum(x, x, out=x)",
           tests=("tests/test_numpy_update.py", "tests/test_numpy_acting.py")),
    Mutant("numpy-row-max-first-column", _o("numpy_acting"), "reference_trainers/paths/numpy_acting.py",
           "out = np.maximum(a[:, 0], a[:, 1])", "out = a[:, 0].copy()", tests=("tests/test_numpy_acting.py",)),
    Mutant("numpy-categorical-running-sum-reset", _o("numpy_acting"), "reference_trainers/paths/numpy_acting.py",
           "running += probs[:, column]", "running = probs[:, column].copy()", tests=("tests/test_numpy_acting.py",)),
    Mutant("ppo-uint8-transfer-ignored", _o("uint8_transfer"), "reference_trainers/ppo/trainer.py",
           "uint8=bool(o.uint8_transfer))", "uint8=False)"),
    Mutant("lean-rollout-ignored", _o("lean_rollout"), "reference_trainers/ppo/trainer.py",
           "self.rollout = choose_rollout(bool(o.lean_rollout))", "self.rollout = choose_rollout(False)"),
    Mutant("stacked-mlps-ignored", _o("stacked_mlps"), "reference_trainers/ppo/trainer.py",
           "bool(self.config.optimizations.stacked_mlps))", "False)"),
    Mutant("fused-gae-ignored", _o("fused_gae"), "reference_trainers/ppo/trainer.py",
           "self.gae = compute_gae_fused if o.fused_gae else compute_gae", "self.gae = compute_gae"),
    Mutant("packed-gather-ignored", _o("packed_gather"), "reference_trainers/ppo/trainer.py",
           "choose_gather(bool(o.packed_gather),", "choose_gather(False,"),
    Mutant("ppo-aten-tanh-ignored", _o("aten_tanh"), "reference_trainers/ppo/trainer.py",
           "self.aten_tanh_from = mlp.aten_tanh_from(c)", "self.aten_tanh_from = None"),
    Mutant("ppo-cpp-wrapper-ignored", _o("compile_cpp_wrapper"), "reference_trainers/ppo/updates.py",
           "cpp_wrapper=bool(o.compile_cpp_wrapper))", "cpp_wrapper=False)"),
    # IQN
    Mutant("quantile-loss-always-autograd", _o("hand_written_quantile_loss"), "reference_trainers/value/iqn.py",
           "self.hand_written_loss = bool(self.config.optimizations.hand_written_quantile_loss)",
           "self.hand_written_loss = False"),
    # algorithm options
    Mutant("action-repeat-ignored", "env.action_repeat", "reference_trainers/envs/factory.py",
           "return ActionRepeat(env, action_repeat) if action_repeat > 1 else env", "return env"),
    Mutant("heap-retention-never-fixed", "run.heap_retention", "harness/measurement/runner.py",
           "    retain_heap(l.resolution.config.run.heap_retention for l in lives)\n", "",
           tests=("tests/test_allocator.py",)),
    Mutant("heap-retention-mallopt-skipped", "run.heap_retention", "harness/measurement/allocator.py",
           "self.retained = bool(mallopt and mallopt(", "self.retained = bool(mallopt or mallopt(",
           tests=("tests/test_allocator.py",)),
    Mutant("n-step-ignored", "dqn.n_step", "reference_trainers/replay/writers.py",
           "return (OneStepWriter(num_envs, gamma) if n_step == 1", "return (OneStepWriter(num_envs, gamma) if True"),
    Mutant("per-ignored", "dqn.prioritized_replay", "reference_trainers/replay/buffers.py",
           "sampler = (PrioritizedSampler(capacity, alpha, eps, device, generator) if prioritized",
           "sampler = (PrioritizedSampler(capacity, alpha, eps, device, generator) if False"),
    # reduced-precision maths broken: the update skipped or reversed under AMP
    Mutant("amp-update-reversed", _o("amp"), "reference_trainers/paths/learner.py",
           "self.scaler.scale(loss).backward()", "self.scaler.scale(-loss if self.amp else loss).backward()",
           tests=PROPERTIES),
    Mutant("amp-update-skipped", _o("amp"), "reference_trainers/paths/learner.py",
           "                    self.scaler.step(self.optimizer)\n",
           "                    None if self.amp else self.scaler.step(self.optimizer)\n", tests=PROPERTIES),
)
"""One entry per flag code path, and the reduced-precision maths."""


def _copy_project(root: Path, dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in files:
        source = root / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _apply(copy: Path, mutant: Mutant) -> None:
    target = copy / mutant.path
    text = target.read_text(encoding="utf-8")
    count = text.count(mutant.old)
    if count != 1:
        raise SystemExit(f"{mutant.name}: {mutant.path} has {count} occurrences of {mutant.old!r}, expected 1")
    target.write_text(text.replace(mutant.old, mutant.new), encoding="utf-8")


def run_mutant(mutant: Mutant, root: Path = ROOT) -> tuple[bool, float, str]:
    """(killed, seconds, last line of pytest's output) for one mutant in a fresh copy of ``root``."""
    with tempfile.TemporaryDirectory(prefix="rlgauge-mutant-") as tmp:
        copy = Path(tmp)
        _copy_project(root, copy)
        _apply(copy, mutant)
        selection = list(mutant.tests) or ["--effects-of", mutant.key]
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "2",
                               *selection], cwd=copy, capture_output=True, text=True,
                              env={**_env(), "PYTHONPATH": str(copy)})
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        return proc.returncode not in (0, 5), time.perf_counter() - start, lines[-1] if lines else proc.stderr[-200:]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="mutant names or flag keys")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--root", type=Path, default=ROOT, help="the project to copy (default: this checkout)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if args.only is None or m.name in args.only or m.key in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name:<40} {m.key:<40} {m.path}")
        return 0
    survived = []
    for mutant in chosen:
        killed, seconds, last = run_mutant(mutant, args.root)
        print(f"{'killed  ' if killed else 'SURVIVED'} {mutant.name:<40} {seconds:6.1f} s  {last}", flush=True)
        if not killed:
            survived.append(mutant.name)
    print(f"{len(chosen) - len(survived)} killed, {len(survived)} survived" +
          (f": {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    raise SystemExit(main())
