"""Randomized positions (Ruoss et al. 2023): each training row an ordered random sample of its positions
from [0, L), a pure function of the step; validation keeps 0..T-1; refused where no encoding reads them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nanoattn.config import RunConfig
from nanoattn.data import RandomPositions
from nanoattn.data.random_positions import ordered_sample


def test_an_ordered_sample_is_distinct_increasing_and_covers_the_range():
    rng = np.random.default_rng(0)
    drawn = [ordered_sample(rng, 64, 8) for _ in range(400)]
    assert all((np.diff(d) > 0).all() and 0 <= d[0] and d[-1] < 64 for d in drawn)
    seen = np.concatenate(drawn)
    assert set(seen.tolist()) == set(range(64))  # every position of [0, L) is trained
    # Uniform without replacement: each position is in a sample with probability 8/64.
    assert np.bincount(seen, minlength=64).min() > 0.5 * 400 * 8 / 64


def test_training_rows_take_random_positions_and_validation_the_default(byte_data):
    data = RandomPositions(byte_data, 256)
    batch = dict(batch_size=4, seq_len=16, seed=3)
    x, y, positions = data.train_batch(5, **batch)
    plain_x, plain_y = byte_data.train_batch(5, **batch)
    assert torch.equal(x, plain_x) and torch.equal(y, plain_y)  # the data's own rows
    assert positions.dtype == torch.int64 and positions.shape == (4, 16)
    assert (positions.diff(dim=1) > 0).all() and positions.max() < 256
    assert len({tuple(row) for row in positions.tolist()}) == 4  # each row its own sample
    assert torch.equal(positions, data.train_batch(5, **batch)[2])  # a pure function of the step
    assert not torch.equal(positions, data.train_batch(6, **batch)[2])
    # The global batch does not depend on the ranks: rank 1 of 2 draws rows 2 and 3 of the whole.
    ranked = data.train_batch(5, **{**batch, "batch_size": 2}, rank=1, world_size=2)
    assert torch.equal(ranked[2], positions[2:])
    assert all(len(b) == 2 for b in data.val_batches(2, batch_size=2, seq_len=16))  # evaluation: 0..T-1
    with pytest.raises(ValueError, match="^train.random_positions=8 is invalid: rows of 16 tokens need"):
        RandomPositions(byte_data, 8).train_batch(0, **batch)


def test_random_positions_config_errors_are_one_line():
    with pytest.raises(ValueError, match="^train.random_positions=512 is invalid: needs encodings that take "
                                         "given positions: pos='nope' has no use for them"):
        RunConfig(model={"pos": "nope"}, train={"random_positions": 512})
    with pytest.raises(ValueError, match="^train.random_positions=512 is invalid: must be at most "
                                         "model.max_seq_len=256 with pos='learned'"):
        RunConfig(model={"pos": "learned"}, train={"random_positions": 512})
    with pytest.raises(ValueError, match="^train.random_positions=100 is invalid: must be at least the "
                                         "training length 256"):
        RunConfig(train={"random_positions": 100})
    with pytest.raises(ValueError, match="^train.random_positions=0 is invalid"):
        RunConfig(train={"random_positions": 0})
    assert RunConfig(model={"pos": "fire"}, train={"random_positions": 2048}).train.random_positions == 2048
