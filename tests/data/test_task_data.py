"""TaskData: a task's instances as token rows with answer-only targets, drawn as pure functions of seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nanoattn.config import TaskConfig
from nanoattn.data import DataError, TaskData, TokenData, prepare_data
from nanoattn.data.tasks import POOL_STREAM, TRAIN_STREAM
from nanoattn.model import IGNORE_INDEX
from nanoattn.tasks import TASKS, Instance, Segment, Task


def task_data(byte_data, name: str, train_length: int = 8) -> TaskData:
    return TaskData(byte_data, TaskConfig(name=name, train_length=train_length).build(), train_length)


def test_a_row_is_eot_instance_eot_with_targets_on_the_answer_and_the_closing_eot(byte_data):
    data = task_data(byte_data, "copy")
    instance = Instance(3, (Segment("abc>"), Segment("abc", scored=True)))
    ids, scored = data.encode(instance)
    eot = byte_data.eot_id
    assert ids.tolist() == [eot, *b"abc>abc", eot]  # the byte tokenizer's ids are the bytes
    assert scored.tolist() == [False] * 5 + [True] * 4
    x, y = data.rows([instance], 12)
    assert x[0].tolist() == [eot, *b"abc>abc", eot, eot, eot, eot]  # padded with EOT inputs
    assert y[0].tolist() == [IGNORE_INDEX] * 4 + [*b"abc", eot] + [IGNORE_INDEX] * 4


def test_filler_ids_pass_through_and_text_outside_the_alphabet_is_refused(byte_data):
    data = task_data(byte_data, "multikey_needle", 64)
    filler = np.array([7, 8, 9])
    ids, scored = data.encode(Instance(5, (Segment(filler), Segment("?AB="), Segment("1234", scored=True))))
    assert ids[1:4].tolist() == [7, 8, 9] and scored.sum() == 5
    with pytest.raises(ValueError, match=r"task multikey_needle wrote 'ab', outside its alphabet"):
        data.encode(Instance(2, (Segment("ab", scored=True),)))


def test_training_batches_are_pure_in_the_step_and_ranks_split_one_global_batch(byte_data):
    data = task_data(byte_data, "addition", 6)
    first = data.train_batch(5, batch_size=4, seq_len=data.seq_len, seed=1)
    again = data.train_batch(5, batch_size=4, seq_len=data.seq_len, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    other = data.train_batch(6, batch_size=4, seq_len=data.seq_len, seed=1)
    assert not torch.equal(first[0], other[0])
    halves = [data.train_batch(5, batch_size=2, seq_len=data.seq_len, seed=1, rank=r, world_size=2)
              for r in range(2)]
    assert torch.equal(torch.cat([h[0] for h in halves]), first[0])
    # Row 2 of step 5 is the instance its seed words name, on its own.
    instance = data.draw((TRAIN_STREAM, 1, 5, 0, 2), (1, 6), "train")
    ids, _ = data.encode(instance)
    assert first[0][2, :ids.size - 1].tolist() == ids[:-1].tolist()


def test_training_sizes_cover_the_range_and_every_row_has_an_answer(byte_data):
    data = task_data(byte_data, "copy", 8)
    x, y = data.train_batch(0, batch_size=64, seq_len=data.seq_len, seed=0)
    answers = (y != IGNORE_INDEX).sum(dim=1)  # size + 1 (the closing EOT) for copy
    assert set((answers - 1).tolist()) == set(range(1, 9))
    assert data.seq_len == 2 * 8 + 2 and x.shape == (64, data.seq_len)


def test_a_curriculum_grows_the_largest_size_in_equal_stages_then_keeps_every_size(byte_data):
    task = TaskConfig(name="addition").build()
    data = TaskData(byte_data, task, 4, curriculum_steps=100)  # sizes 1..4: a stage of 25 steps each
    steps = (0, 24, 25, 49, 50, 75, 99, 100, 10_000)
    assert [data.largest_size(s) for s in steps] == [1, 1, 2, 2, 3, 4, 4, 4, 4]
    for step in (0, 30, 60, 99, 100):
        x, y = data.train_batch(step, batch_size=64, seq_len=data.seq_len, seed=0)
        digits = ((y != IGNORE_INDEX).sum(dim=1) - 1).tolist()  # the reversed sum: size or size + 1 digits
        sizes = {(row == ord("+")).nonzero().item() - 1 for row in x}  # operand digits: before the '+'
        assert max(sizes) == data.largest_size(step) and min(sizes) == 1 and max(digits) <= max(sizes) + 1
    # Past the curriculum its rows are the plain run's, instance for instance.
    plain = TaskData(byte_data, task, 4)
    assert all(torch.equal(a, b) for a, b in zip(data.train_batch(100, batch_size=8, seq_len=16, seed=3),
                                                 plain.train_batch(100, batch_size=8, seq_len=16, seed=3),
                                                 strict=True))


def test_a_fixed_training_set_draws_every_row_from_its_n_instances(byte_data):
    task = TaskConfig(name="addition").build()
    data = TaskData(byte_data, task, 3, train_examples=5)
    rows = {tuple(row.tolist()) for step in range(20)
            for row in data.train_batch(step, batch_size=8, seq_len=data.seq_len, seed=1)[0]}
    pool = {tuple(data.rows([data.draw((POOL_STREAM, 1, i), (1, 3), "train")], data.seq_len)[0][0].tolist())
            for i in range(5)}
    assert rows == pool  # 160 rows with replacement: all five, and nothing else
    other_seed = {tuple(row.tolist()) for row in data.train_batch(0, batch_size=8, seq_len=data.seq_len,
                                                                   seed=2)[0]}
    assert not other_seed & pool


def test_validation_batches_are_fixed_and_use_the_held_out_filler(byte_data):
    data = task_data(byte_data, "variable_tracking", 64)
    a = data.val_batches(2, batch_size=3, seq_len=data.seq_len)
    b = data.val_batches(2, batch_size=3, seq_len=data.seq_len)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b, strict=True))
    val = byte_data.tokens("val")
    row = a[0][0][0].numpy()
    # The first filler run of the row is a contiguous slice of the val split.
    run = row[1:row.tolist().index(ord("<"))]
    starts = [i for i in range(val.size - run.size) if np.array_equal(val[i:i + run.size], run)]
    assert run.size == 0 or starts


def test_seq_len_too_short_for_the_training_instances_is_refused(byte_data):
    data = task_data(byte_data, "copy", 8)
    assert data.check_seq_len(None) == 18 and data.check_seq_len(40) == 40
    with pytest.raises(ValueError, match=r"train.seq_len=10 is invalid for task copy at train_length=8: "
                                         r"its instances need 18"):
        data.check_seq_len(10)


def test_a_tokenizer_without_the_tasks_characters_is_refused(tmp_path, text_config, write_corpus):
    char_data = TokenData(prepare_data(text_config(tmp_path / "data", write_corpus(tmp_path / "c", 4),
                                                   tokenizer="char")))
    missing = [c for c in TASKS["addition"].alphabet if char_data.tokenizer.token_to_id(c) is None]
    assert missing, "the made-up corpus should lack some of the task's characters"
    with pytest.raises(DataError, match=r"task addition needs every character of .* as one token"):
        TaskData(char_data, TASKS["addition"](), 4)


class Positioned(Task):
    """A stand-in task whose instances give position ids (10, 11, ... and the answer back at 10)."""

    name, alphabet, min_size, uses_filler = "positioned", "ab>", 1, False

    def instance(self, rng, size, filler=None):
        text = "".join(np.asarray(list("ab"))[rng.integers(0, 2, size)])
        return Instance(size, (Segment(text + ">"), Segment(text, scored=True)),
                        positions=(*range(10, 11 + size), *range(10, 10 + size)))

    def for_training(self, instance, rng):
        shift = int(rng.integers(0, 5))
        return Instance(instance.size, instance.segments, tuple(p + shift for p in instance.positions))

    def max_tokens(self, size):
        return 2 * size + 1


def test_task_rows_carry_their_instances_positions(byte_data):
    data = TaskData(byte_data, Positioned(), 3)
    instance = data.draw((1, 2), (3, 3), "val")
    x, y, positions = data.rows([instance], 9)
    # EOT, abc>, ab (c, predicting the closing EOT, is no input), padding
    assert positions.tolist() == [[0, 10, 11, 12, 13, 10, 11, 12, 0]]
    train = data.train_batch(0, batch_size=4, seq_len=9, seed=0)
    assert len(train) == 3 and (train[2][:, 1] >= 10).all() and len(set(train[2][:, 1].tolist())) > 1
    assert torch.equal(train[2], data.train_batch(0, batch_size=4, seq_len=9, seed=0)[2])  # a pure function
    val = data.val_batches(1, batch_size=2, seq_len=9)[0]
    assert (val[2][:, 1] == 10).all()  # validation takes instances as drawn


def test_a_coupled_row_of_123_plus_45_carries_its_ids(byte_data):
    """The row EOT 1 2 3 + 4 5 = 8 6 1 (the last predicts the closing EOT): EOT at 0, then Cho et al.'s."""
    task = TaskConfig(name="addition", train_length=3, position_coupling=True).build()
    data = TaskData(byte_data, task, 3)
    x, y, positions = data.rows([task.written("123", "45")])
    assert x[0].tolist() == [byte_data.eot_id, *b"123+45=861"]
    assert positions.tolist() == [[0, 4, 3, 2, 1, 3, 2, 1, 2, 3, 4]]
    x, _, trained = data.train_batch(0, batch_size=8, seq_len=data.seq_len, seed=0)
    shifts = trained[x == ord("+")] - 1  # '+' is at 1 from start 1, whatever the operands' sizes
    assert (trained[:, 0] == 0).all() and trained.max() <= task.max_position and len(set(shifts.tolist())) > 1
