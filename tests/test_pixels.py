"""Pixel observations: the Nature CNN body, uint8 storage and transfer, background minibatch
assembly (num_workers), on a tiny synthetic image env (Atari itself is in test_atari.py)."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest
import torch

from harness.stats.parity import EXACT, TOLERANCES
from pixel_env import PIXEL_ENV
from reference_trainers import build_trainer
from reference_trainers.runtime import device as dev
from reference_trainers.envs.atari import is_image_space
from reference_trainers.replay.buffers import FrameStorage, ListStorage, make_replay
from reference_trainers.config.schema import ConfigError, ModelConfig, build_config
from reference_trainers.nets.networks import ActorCritic, IQNNetwork, NatureCNN, QNetwork, normalise_pixels
from reference_trainers.replay.writers import TransitionBatch, make_writer
from reference_trainers.paths.prefetch import THREAD_PREFIX, Prefetcher
from reference_trainers.config.resolve import resolve_config
from reference_trainers.paths.speedups import HostToDevice

CPU = torch.device("cpu")
PIXELS = ["device=cpu", f"env.id={PIXEL_ENV}", "env.num_envs=2", "env.vectorization=sync", "seed=3",
          "optimizations.torch_threads=1"]  # tiny convolutions: one thread (see strategies.PIXEL_OVERRIDES)
TINY_ALGO = {
    "ppo": ["algo=ppo", "ppo.num_steps=8", "ppo.num_minibatches=4", "ppo.update_epochs=2"],
    "dqn": ["algo=dqn", "dqn.buffer_size=64", "dqn.batch_size=4", "dqn.learning_starts=8", "dqn.gradient_steps=3",
            "dqn.log_interval=16", "dqn.target_update_interval=4"],
    "iqn": ["algo=iqn", "iqn.buffer_size=64", "iqn.batch_size=4", "iqn.learning_starts=8", "iqn.gradient_steps=3",
            "iqn.log_interval=16", "iqn.num_tau_samples=4", "iqn.num_tau_prime_samples=4",
            "iqn.num_quantile_samples=2", "iqn.quantile_embedding_dim=8"],
}


def train(algo: str, *overrides: str, iterations: int = 2) -> tuple[dict[str, torch.Tensor], object]:
    """Train on the pixel env; process settings (threads) are restored so runs start alike."""
    saved = dev.process_settings()
    trainer = build_trainer(resolve_config(build_config({}, PIXELS + TINY_ALGO[algo] + list(overrides))))
    try:
        for _ in range(iterations):
            trainer.iterate()
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, trainer
    finally:
        trainer.close()
        dev.restore_process_settings(saved)


def assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Within the exact parity class: identical maths, only kernel round-off may differ."""
    tol = TOLERANCES[EXACT]
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=tol.rtol, atol=tol.atol)


# --------------------------------------------------------------------------- body choice

def test_auto_body_is_cnn_for_images_and_mlp_otherwise() -> None:
    pixels = resolve_config(build_config({}, PIXELS))
    assert pixels.config.model.body == "cnn" and "model.body" in pixels.reasons
    assert pixels.config.optimizations.uint8_transfer is False  # the plain default stays plain
    flat = resolve_config(build_config({}, ["device=cpu"]))
    assert flat.config.model.body == "mlp"


@pytest.mark.parametrize(("overrides", "needle"), [
    (["device=cpu", "model.body=cnn"], "model.body: 'cnn' needs uint8 (channels, height, width) image observations"),
    (["device=cpu", "optimizations.uint8_transfer=true"],
     "optimizations.uint8_transfer: true cannot be used here (model.body 'mlp': it covers the cnn body)"),
    (PIXELS + ["optimizations.uint8_transfer=true", "model.body=mlp"],
     "optimizations.uint8_transfer: true cannot be used here (model.body 'mlp'"),
    (PIXELS + ["algo=dqn", "dqn.prioritized_replay=true", "optimizations.num_workers=2"],
     "optimizations.num_workers: 2 cannot be used here (dqn.prioritized_replay: prioritized minibatches cannot be "
     "prefetched"),
])
def test_pixel_settings_that_cannot_work_are_one_line_config_errors(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_config(build_config({}, overrides))
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("key", "value"), [("optimizations.num_workers", -1), ("env.atari.screen_size", 16),
                                            ("env.preprocessing", "pixels"), ("model.body", "resnet")])
def test_pixel_keys_are_validated(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_config({}, [f"{key}={value}"])


def test_only_channels_first_uint8_images_count_as_images() -> None:
    box = lambda shape, dtype=np.uint8: gym.spaces.Box(0, 255, shape, dtype)  # noqa: E731
    assert is_image_space(box((4, 84, 84))) and is_image_space(box((2, 36, 36)))
    assert not is_image_space(box((210, 160, 3)))  # a raw channels-last Atari screen
    assert not is_image_space(box((4, 84, 84), np.float32)) and not is_image_space(box((84, 84)))


def test_nature_cnn_has_the_paper_shapes_and_scales_by_255() -> None:
    cnn = NatureCNN((4, 84, 84))
    convs = [m for m in cnn.conv if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [(32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)),
                                                                          (64, (3, 3), (1, 1))]
    assert cnn.fc[0].in_features == 3136 and cnn.out_dim == 512
    assert NatureCNN((4, 84, 84), features=None).out_dim == 3136
    frames = torch.full((1, 4, 84, 84), 255, dtype=torch.uint8)
    assert torch.equal(normalise_pixels(frames), torch.ones(1, 4, 84, 84))


def test_every_network_shares_one_cnn_torso_over_pixels() -> None:
    config, shape = ModelConfig(body="cnn"), (2, 36, 36)
    x = torch.randint(0, 256, (3, *shape), dtype=torch.uint8)
    actor_critic = ActorCritic(shape, gym.spaces.Discrete(5), config)
    logits, value = actor_critic(x)
    assert logits.shape == (3, 5) and value.shape == (3,)
    assert isinstance(actor_critic.torso, NatureCNN)  # one torso under both heads
    assert QNetwork(shape, 5, config)(x).shape == (3, 5)
    iqn = IQNNetwork(shape, 5, config, embedding_dim=8)
    assert isinstance(iqn.psi, NatureCNN) and iqn(x, torch.rand(3, 6)).shape == (3, 6, 5)


# --------------------------------------------------------------------------- uint8 transfer and storage

def test_uint8_transfer_feeds_identical_inputs() -> None:
    frames = np.random.default_rng(0).integers(0, 256, size=(4, 2, 36, 36), dtype=np.uint8)
    plain = HostToDevice(CPU).observations(frames, "obs")
    kept = HostToDevice(CPU, uint8=True).observations(frames, "obs")
    assert plain.dtype == torch.float32 and kept.dtype == torch.uint8  # 4 bytes a pixel vs 1
    assert torch.equal(normalise_pixels(plain), normalise_pixels(kept))
    flat = np.ones((2, 4), dtype=np.float32)  # float observations are never narrowed
    assert HostToDevice(CPU, uint8=True).observations(flat, "obs").dtype == torch.float32


def test_writers_and_replay_keep_frames_as_uint8() -> None:
    rng = np.random.default_rng(1)
    shape = (2, 36, 36)
    batch = TransitionBatch(rng.integers(0, 256, (5, *shape), dtype=np.uint8), np.arange(5) % 3,
                            rng.standard_normal(5).astype(np.float32), rng.integers(0, 256, (5, *shape), dtype=np.uint8),
                            np.full(5, 0.99, dtype=np.float32))
    for n in (1, 3):
        out = make_writer(5, 0.99, n, shape, np.uint8).push(batch.obs, batch.actions, batch.rewards, batch.next_obs,
                                                            np.ones(5, bool), np.zeros(5, bool), np.ones(5, bool))
        assert out.obs.dtype == np.uint8 and out.next_obs.dtype == np.uint8
    samples = []
    for kind, storage_type in (("list", ListStorage), ("tensor", FrameStorage)):
        generator = torch.Generator().manual_seed(0)
        replay = make_replay(kind, 8, int(np.prod(shape)), CPU, HostToDevice(CPU, uint8=True), generator,
                             frame_shape=shape)
        assert type(replay.storage) is storage_type
        replay.add(batch)
        replay.add(batch)  # wraps the ring
        samples.append(replay.sample(6))
    assert samples[1].obs.dtype == torch.uint8 and replay.storage.obs.dtype == torch.uint8
    for a, b in zip(samples[0], samples[1]):
        if a is not None:
            assert torch.equal(a, b)


@pytest.mark.parametrize("algo", ["ppo", "dqn", "iqn"])
def test_uint8_transfer_trains_exactly_like_the_float32_copy(algo: str) -> None:
    flags = ["optimizations.batch_inference=true"] + (["optimizations.replay=tensor"] if algo != "ppo" else [])
    plain, _ = train(algo, *flags)
    kept, trainer = train(algo, *flags, "optimizations.uint8_transfer=true")
    assert trainer.config.optimizations.uint8_transfer is True
    assert_same_params(plain, kept)


def test_ppo_rollout_stores_uint8_frames_only_with_uint8_transfer() -> None:
    for flag, dtype in (("false", torch.float32), ("true", torch.uint8)):
        trainer = build_trainer(resolve_config(build_config({}, PIXELS + TINY_ALGO["ppo"] + [
            f"optimizations.uint8_transfer={flag}"])))
        try:
            assert trainer.obs_buf.dtype == dtype and trainer.obs_buf.shape == (8, 2, 2, 36, 36)
        finally:
            trainer.close()


# --------------------------------------------------------------------------- num_workers

def test_prefetcher_yields_in_order_and_bounds_its_lookahead() -> None:
    started: list[int] = []
    prefetcher = Prefetcher(2)
    try:
        gate = threading.Event()

        def work(i: int) -> int:
            started.append(i)
            gate.wait(5)
            return i * i

        results = prefetcher.map(work, iter(range(10)))
        gate.set()
        assert list(results) == [i * i for i in range(10)]
        gate.clear()
        lazy = prefetcher.map(work, range(10))
        gate.set()
        assert next(lazy) == 0
        assert len(started) <= 10 + 3  # at most num_workers + 1 submitted before the first result
        lazy.close()
    finally:
        prefetcher.close()
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


def test_inline_prefetcher_starts_no_thread() -> None:
    before = threading.active_count()
    prefetcher = Prefetcher(0)
    assert list(prefetcher.map(lambda x: x + 1, range(3))) == [1, 2, 3]
    assert threading.active_count() == before
    prefetcher.close()


@pytest.mark.parametrize("algo", ["ppo", "dqn", "iqn"])
def test_num_workers_gives_identical_training_and_leaves_no_thread(algo: str) -> None:
    flags = ["optimizations.batch_inference=true", "optimizations.uint8_transfer=true"]
    if algo != "ppo":
        flags.append("optimizations.replay=tensor")
    inline, _ = train(algo, *flags)
    prefetched, trainer = train(algo, *flags, "optimizations.num_workers=2")
    assert trainer.prefetcher.num_workers == 2 and trainer.updates > 0
    assert_same_params(inline, prefetched)
    assert not [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


def test_num_workers_prefetches_list_replay_gathers_identically() -> None:
    inline, _ = train("dqn", "optimizations.replay=list")
    prefetched, _ = train("dqn", "optimizations.replay=list", "optimizations.num_workers=2")
    assert_same_params(inline, prefetched)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_uint8_transfer_stages_uint8_frames_in_pinned_memory_on_cuda() -> None:
    frames = np.random.default_rng(2).integers(0, 256, size=(4, 2, 36, 36), dtype=np.uint8)
    cuda = torch.device("cuda")
    kept = HostToDevice(cuda, pinned=True, non_blocking=True, uint8=True)
    out = kept.observations(frames, "obs")
    staged = kept._staging["obs"]
    assert out.device.type == "cuda" and out.dtype == torch.uint8
    assert staged.dtype == torch.uint8 and staged.is_pinned()
    plain = HostToDevice(cuda).observations(frames, "obs")
    assert torch.equal(normalise_pixels(out), normalise_pixels(plain))
