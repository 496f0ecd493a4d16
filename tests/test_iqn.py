"""IQN (reference_trainers/value/iqn.py, IQNNetwork in nets/networks.py): the quantile Huber loss (its
autograd and hand-written forms) on a hand-computed case and against the paper's formula under autograd, its pairwise (N x N')
structure, the cosine tau embedding, network shapes, targets, and the fractions the trainer samples."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from value_trainers import make

from reference_trainers.config.schema import ModelConfig
from reference_trainers.nets.networks import IQNNetwork, cosine_embedding
from reference_trainers.value.iqn import IQNTrainer, iqn_targets, quantile_huber_loss


def textbook_loss(quantiles: torch.Tensor, targets: torch.Tensor, taus: torch.Tensor, kappa: float) -> torch.Tensor:
    """Dabney et al. 2018, eq. 3, written with masks and ``where``, differentiated by autograd."""
    delta = targets.unsqueeze(1) - quantiles.unsqueeze(2)
    abs_delta = delta.abs()
    huber = torch.where(abs_delta <= kappa, 0.5 * delta.pow(2), kappa * (abs_delta - 0.5 * kappa))
    weight = (taus.unsqueeze(2) - (delta.detach() < 0).float()).abs()
    return (weight * huber / kappa).sum(dim=1).mean(dim=1)


# --------------------------------------------------------------------------- quantile Huber loss

HAND = {"quantiles": [[0.0, 1.0]], "targets": [[0.5, 3.0]], "taus": [[0.25, 0.75]]}
# delta_ij = target_j - quantile_i:  i=0: 0.5, 3.0   i=1: -0.5, 2.0
# kappa = 1: Huber 0.125, 2.5 | 0.125, 1.5; weights |tau_i - 1{delta<0}|: 0.25, 0.25 | 0.25, 0.75
#   rho: 0.03125, 0.625 | 0.03125, 1.125 -> sum_i mean_j = 0.328125 + 0.578125 = 0.90625
#   d/dq_i = -(1/N') sum_j w_ij clamp(delta_ij, -1, 1): -(0.125 + 0.25)/2 = -0.1875, -(-0.125 + 0.75)/2 = -0.3125
# kappa = 2: Huber 0.125, 4.0 | 0.125, 2.0 -> rho/kappa: (0.03125 + 1.0)/2 + (0.03125 + 1.5)/2 = 1.28125, / 2 = 0.640625
#   d/dq_i = -(1/N') sum_j w_ij clamp(delta_ij, -2, 2) / 2: -(0.125 + 0.5)/4, -(-0.125 + 1.5)/4


@pytest.mark.parametrize("hand_written", [False, True], ids=["autograd", "hand-written"])
@pytest.mark.parametrize(("kappa", "loss", "grad"), [(1.0, 0.90625, [-0.1875, -0.3125]),
                                                     (2.0, 0.640625, [-(0.125 + 0.5) / 2 / 2, -(-0.125 + 1.5) / 2 / 2])])
def test_quantile_huber_loss_hand_computed(kappa: float, loss: float, grad: list[float], hand_written: bool) -> None:
    quantiles = torch.tensor(HAND["quantiles"], requires_grad=True)
    value = quantile_huber_loss(quantiles, torch.tensor(HAND["targets"]), torch.tensor(HAND["taus"]), kappa,
                                hand_written)
    assert value.shape == (1,) and value.dtype == torch.float32
    assert value.item() == pytest.approx(loss, abs=1e-7)
    value.sum().backward()
    torch.testing.assert_close(quantiles.grad, torch.tensor([grad]), rtol=0, atol=1e-7)


@pytest.mark.parametrize("hand_written", [False, True], ids=["autograd", "hand-written"])
@given(batch=st.integers(1, 5), n=st.integers(1, 9), n_prime=st.integers(1, 9), kappa=st.sampled_from([0.5, 1.0, 3.0]),
       seed=st.integers(0, 2**16), ties=st.booleans())
def test_quantile_huber_loss_matches_the_paper_formula_and_its_autograd(batch: int, n: int, n_prime: int,
                                                                        kappa: float, seed: int, ties: bool,
                                                                        hand_written: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    quantiles = (torch.randn(batch, n, generator=gen) * 2).requires_grad_()
    targets = torch.randn(batch, n_prime, generator=gen) * 2
    if ties:  # delta == 0 exactly, where the indicator is ambiguous
        targets[:, 0] = quantiles.detach()[:, 0]
    taus = torch.rand(batch, n, generator=gen)
    upstream = torch.rand(batch, generator=gen)
    fast = quantile_huber_loss(quantiles, targets, taus, kappa, hand_written)
    (fast * upstream).sum().backward()
    fast_grad, quantiles.grad = quantiles.grad.clone(), None
    reference = textbook_loss(quantiles, targets, taus, kappa)
    (reference * upstream).sum().backward()
    torch.testing.assert_close(fast, reference, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fast_grad, quantiles.grad, rtol=1e-5, atol=1e-6)


def test_quantile_huber_loss_averages_over_all_n_by_n_prime_pairs() -> None:
    gen = torch.Generator().manual_seed(0)
    quantiles, targets, taus = torch.randn(3, 4, generator=gen), torch.randn(3, 5, generator=gen), torch.rand(3, 4, generator=gen)
    loss = quantile_huber_loss(quantiles, targets, taus, 1.0)
    for b in range(3):  # the same loss from an explicit double loop over pairs (i, j)
        total = 0.0
        for i in range(4):
            for j in range(5):
                d = float(targets[b, j] - quantiles[b, i])
                huber = 0.5 * d * d if abs(d) <= 1 else abs(d) - 0.5
                total += abs(float(taus[b, i]) - (d < 0)) * huber / 5
        assert loss[b].item() == pytest.approx(total, rel=1e-5)
    # every target j reaches every quantile i; samples do not mix
    moved = targets.clone()
    moved[1, 2] += 5.0
    changed = quantile_huber_loss(quantiles, moved, taus, 1.0)
    assert changed[1] != loss[1] and changed[0] == loss[0] and changed[2] == loss[2]
    q = quantiles.clone().requires_grad_()
    quantile_huber_loss(q, moved, taus, 1.0)[1].backward()
    assert (q.grad[1] != 0).all() and (q.grad[[0, 2]] == 0).all()


@pytest.mark.parametrize("hand_written", [False, True], ids=["autograd", "hand-written"])
def test_quantile_huber_loss_is_zero_when_all_quantiles_equal_all_targets(hand_written: bool) -> None:
    loss = quantile_huber_loss(torch.ones(2, 3), torch.ones(2, 4), torch.rand(2, 3), 1.0, hand_written)
    assert torch.equal(loss, torch.zeros(2))


# --------------------------------------------------------------------------- tau embedding and network

def test_cosine_embedding_shapes_and_values() -> None:
    taus = torch.tensor([[0.0, 0.5, 0.25]])
    emb = cosine_embedding(taus, 64)
    assert emb.shape == (1, 3, 64) and emb.dtype == torch.float32
    assert torch.equal(emb[..., 0], torch.ones(1, 3))  # i = 0: cos(0)
    torch.testing.assert_close(emb[0, 1, :4], torch.tensor([1.0, 0.0, -1.0, 0.0]), atol=1e-6, rtol=0)  # cos(pi i / 2)
    torch.testing.assert_close(emb[0, 2, 3], torch.tensor(math.cos(math.pi * 3 * 0.25)))
    assert cosine_embedding(torch.rand(5, 7, 2), 16).shape == (5, 7, 2, 16)


@pytest.mark.parametrize("hidden", [[32], [32, 16], [32, 24, 16]])
def test_iqn_network_maps_obs_and_taus_to_quantiles_per_action(hidden: list[int]) -> None:
    torch.manual_seed(0)
    net = IQNNetwork(4, 3, ModelConfig(hidden_sizes=hidden, activation="relu"), embedding_dim=64)
    assert net.phi.in_features == 64 and net.phi.out_features == net.psi[-2].out_features
    obs, taus = torch.randn(5, 4), torch.rand(5, 7)
    out = net(obs, taus)
    assert out.shape == (5, 7, 3) and out.dtype == torch.float32
    same_tau = net(obs, taus[:, :1].expand(5, 7))
    torch.testing.assert_close(same_tau, same_tau[:, :1].expand(5, 7, 3))  # one tau -> one quantile
    assert not torch.allclose(out[:, 0], out[:, 1])  # another tau, another quantile
    torch.testing.assert_close(net(obs[2:3], taus[2:3]), out[2:3])  # rows are independent


def test_iqn_targets_take_the_quantiles_of_the_best_next_action() -> None:
    next_quantiles = torch.tensor([[[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]]])  # (B=1, N'=3, A=2)
    targets = iqn_targets(next_quantiles, torch.tensor([[5.0, 1.0]]), torch.tensor([1.0]), torch.tensor([0.5]))
    assert torch.equal(targets, torch.tensor([[1.5, 2.0, 2.5]]))  # action 0 chosen by the selection values
    ended = iqn_targets(next_quantiles, torch.tensor([[0.0, 1.0]]), torch.tensor([1.0]), torch.tensor([0.0]))
    assert torch.equal(ended, torch.ones(1, 3))


# --------------------------------------------------------------------------- the trainer's fractions

def test_iqn_trainer_acts_on_k_fractions_and_learns_on_n_and_n_prime() -> None:
    trainer = make("iqn", "iqn.double_q=true")
    shapes: list[tuple[str, tuple[int, ...]]] = []
    forward, target = trainer.forward, trainer.target_forward
    trainer.forward = lambda obs, taus: (shapes.append(("online", tuple(taus.shape))), forward(obs, taus))[1]
    trainer.target_forward = lambda obs, taus: (shapes.append(("target", tuple(taus.shape))), target(obs, taus))[1]
    try:
        assert isinstance(trainer, IQNTrainer) and isinstance(trainer.model, IQNNetwork)
        trainer.select_actions(trainer.next_obs)
        assert shapes == [("online", (1, 4)), ("online", (1, 4))]  # per env, K = 4 fractions
        shapes.clear()
        for _ in range(5):
            trainer._env_step()
        shapes.clear()
        batch = trainer.train_batch(trainer.replay.sample(8))
        assert [tuple(t.shape) for t in batch[5:]] == [(8, 8), (8, 6), (8, 4)]  # N, N', K
        assert all(((t >= 0) & (t < 1)).all() for t in batch[5:])
        trainer.learner.step(*batch)
        assert sorted(shapes) == [("online", (8, 4)), ("online", (8, 8)), ("target", (8, 6))]  # double Q selects
    finally:
        trainer.close()
