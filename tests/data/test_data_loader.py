"""TokenData: batches as a pure function of the step, distinct ranks, fixed validation, sequential walks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nanoattn.data import DataError, TokenData, bits_per_byte

B, T = 4, 32


def _rows(x: torch.Tensor) -> set[tuple[int, ...]]:
    return {tuple(row) for row in x.tolist()}


def test_train_batch_is_windows_of_the_train_split(byte_data):
    x, y = byte_data.train_batch(0, batch_size=B, seq_len=T, seed=0)
    assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one token
    train = byte_data.tokens("train")[:].tobytes()
    for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
        window = np.array([*row_x, row_y[-1]], dtype=np.uint16).tobytes()
        assert window in train


def test_a_resumed_run_sees_the_same_batches(byte_data):
    resumed = TokenData(byte_data.data_dir)  # a new process: nothing shared but the folder
    for step, micro_step in ((0, 0), (7, 0), (7, 1), (12_345, 3)):
        kwargs = dict(batch_size=B, seq_len=T, seed=1, micro_step=micro_step, rank=1, world_size=2)
        assert all(torch.equal(a, b) for a, b in zip(byte_data.train_batch(step, **kwargs),
                                                     resumed.train_batch(step, **kwargs), strict=True))
    one = byte_data.train_batch(5, batch_size=B, seq_len=T, seed=0)[0]
    for other in (dict(step=6, seed=0), dict(step=5, seed=1), dict(step=5, seed=0, micro_step=1)):
        assert not torch.equal(one, byte_data.train_batch(**other, batch_size=B, seq_len=T)[0])


def test_ranks_get_distinct_windows_that_together_form_the_global_batch(byte_data):
    for step in range(5):
        ranks = [byte_data.train_batch(step, batch_size=B, seq_len=T, seed=0, rank=r, world_size=4)[0]
                 for r in range(4)]
        assert len(set().union(*map(_rows, ranks))) == 4 * B
        single = byte_data.train_batch(step, batch_size=4 * B, seq_len=T, seed=0)[0]
        assert torch.equal(torch.cat(ranks), single)  # the split across ranks does not change the data


def test_val_batches_are_fixed_and_span_the_split(byte_data):
    batches = byte_data.val_batches(3, batch_size=B, seq_len=T)
    again = TokenData(byte_data.data_dir).val_batches(3, batch_size=B, seq_len=T)
    assert len(batches) == 3 and all(x.shape == y.shape == (B, T) for x, y in batches)
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(batches, again, strict=True))
    val = byte_data.tokens("val")
    assert batches[0][0][0].tolist() == val[:T].tolist()  # first window at the start ...
    assert batches[-1][1][-1].tolist() == val[-T:].tolist()  # ... last one ends at the end


def test_a_split_too_short_for_the_window_fails_naming_the_numbers(byte_data):
    n_val = byte_data.tokens("val").size
    assert byte_data.val_batches(1, batch_size=1, seq_len=n_val - 1)
    with pytest.raises(DataError, match=f"the val split has {n_val:,} tokens, too few for one window of "
                                        f"seq_len \\+ 1 = {n_val + 1}"):
        byte_data.val_batches(1, batch_size=1, seq_len=n_val)
    with pytest.raises(DataError, match="the val split"):
        next(byte_data.sequential("val", n_val))


@pytest.mark.parametrize("length, stride", [(64, None), (64, 64), (64, 24), (50, 1)])
def test_sequential_scores_every_target_once(byte_data, length, stride):
    val = byte_data.tokens("val")
    step = stride or length
    scored = []
    for k, window in enumerate(byte_data.sequential("val", length, stride)):
        assert window.dtype == np.int64 and window.tolist() == val[k * step:k * step + length + 1].tolist()
        new = length if k == 0 else step  # the documented rule: all of the first, the last `stride` after
        scored += range(k * step + length + 1 - new, k * step + length + 1)
    assert scored == list(range(1, len(scored) + 1))  # targets 1, 2, 3, ... each exactly once
    assert val.size - 1 - len(scored) < step  # only a tail shorter than one stride is left out


def test_bad_arguments_fail_naming_the_value(byte_data):
    with pytest.raises(ValueError, match="train_batch.rank=2 is invalid"):
        byte_data.train_batch(0, batch_size=B, seq_len=T, seed=0, rank=2, world_size=2)
    with pytest.raises(ValueError, match="train_batch.step=-1 is invalid"):
        byte_data.train_batch(-1, batch_size=B, seq_len=T, seed=0)
    with pytest.raises(ValueError, match="sequential.stride=65 is invalid"):
        next(byte_data.sequential("val", 64, 65))
    with pytest.raises(ValueError, match="split='test' is invalid"):
        byte_data.tokens("test")
    with pytest.raises(DataError, match="no prepared data here"):
        TokenData(byte_data.data_dir.parent)


def test_bits_per_byte():
    assert bits_per_byte(math.log(2), 1.0) == pytest.approx(1.0)
    assert bits_per_byte(2.0, 2.5) == pytest.approx(2.0 / math.log(2) / 2.5)
