"""Marking a digit's place: position coupling (Cho et al. 2024), index hints (Zhou et al. 2023) and the
reversed operands Abacus needs, written out by hand for ``123+45=`` and its answer 168 (``861`` reversed),
then checked against an independent reading of every drawn instance."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

from nanoattn.config import RunConfig, TaskConfig
from nanoattn.tasks import TASKS
from nanoattn.tasks.addition import HINTS, Addition

SEEDS = range(40)


def written(task: Addition, a: str, b: str) -> tuple[str, str, tuple | None]:
    instance = task.written(a, b)
    question, answer = instance.segments
    return question.piece, answer.piece, instance.positions


def test_position_coupling_of_123_plus_45():
    """Cho et al.'s ids from start 1 ("least significant digit has least position ID"): a digit of place
    j at 2 + j, '+' and '=' at 1. Units (3, 5, 8) share 2, tens (2, 4, 6) share 3, hundreds (1, 1) 4."""
    question, answer, positions = written(Addition(position_coupling=True, max_position=20), "123", "45")
    assert (question, answer) == ("123+45=", "861")
    assert positions == (4, 3, 2, 1,  # 1 2 3 +
                         3, 2, 1,  # 4 5 =
                         2, 3, 4)  # 8 6 1
    # Written least significant digit first, each digit keeps its place's id.
    question, answer, positions = written(Addition(position_coupling=True, max_position=20,
                                                   reversed_operands=True), "123", "45")
    assert (question, answer, positions) == ("321+54=", "861", (2, 3, 4, 1, 2, 3, 1, 2, 3, 4))
    # The answer most significant digit first: '=' after the answer's ids, at 1 + its digits + 1.
    assert written(Addition(position_coupling=True, max_position=20, reversed_answer=False), "123",
                   "45")[2] == (4, 3, 2, 1, 3, 2, 5, 4, 3, 2)


def test_the_authors_format_token_by_token():
    """Cho et al.'s code (src/data/addition.py, AdditionDatasetWithCoupledPositions with padding=True,
    pad_token '0', reverse_output=True) writes 12345 + 678 as ``12345+00678=320310``: the shorter operand
    zero-padded to 5 digits and the sum 13023 to 6, reversed; ids A 6 5 4 3 2, '+' 1, B 6 5 4 3 2, '=' 1,
    the answer 2..7 (the row's EOTs at 0, as their BOS and EOS)."""
    task = Addition(position_coupling=True, max_position=17, zero_padded=True)
    question, answer, positions = written(task, "12345", "678")
    assert (question, answer) == ("12345+00678=", "320310")
    assert positions == (6, 5, 4, 3, 2, 1, 6, 5, 4, 3, 2, 1, 2, 3, 4, 5, 6, 7)
    assert written(task, "3", "4")[:2] == ("3+4=", "70")  # 7 padded to 2 digits: 07, reversed


def test_independent_lengths_train_every_pair_of_operand_lengths_and_evaluate_exact_ones():
    """In training each operand's digits are drawn on their own, uniform in [1, D] (Cho et al.; McLeish
    et al. train on every pair); evaluation keeps both at the bin's digits."""
    task = Addition(independent_lengths=True, zero_padded=True)
    pairs = collections.Counter()
    for seed in range(2000):
        rng = np.random.default_rng(seed)
        size = task.training_size(rng, 1, 5)
        question = task.for_training(task.instance(rng, size), rng).segments[0].piece
        a, b = question.rstrip("=").split("+")
        pairs[len(a.lstrip("0") or "0"), len(b.lstrip("0") or "0")] += 1
        assert len(a) == len(b)  # zero-padded to the longer
    assert set(pairs) == {(i, j) for i in range(1, 6) for j in range(1, 6)}
    assert max(pairs.values()) < 2 * min(pairs.values())  # near uniform: 80 each expected
    evaluated = task.instance(np.random.default_rng(0), 7).segments[0].piece
    assert [len(n) for n in evaluated.rstrip("=").split("+")] == [7, 7]


def test_index_hints_of_123_plus_45():
    """Each digit after the letter of its place: a for units, b for tens, c for hundreds."""
    question, answer, positions = written(Addition(index_hints=True), "123", "45")
    assert (question, answer, positions) == ("c1b2a3+b4a5=", "a8b6c1", None)
    assert written(Addition(index_hints=True, reversed_answer=False), "123", "45")[1] == "c1b6a8"


def test_copy_and_reverse_coupling_of_abc():
    """Cho et al.'s copy: input symbol i and its copy at 1 + i, '>' at 1; reverse: input symbol i at i,
    '>' at n + 1, and the answer back down."""
    rng = np.random.default_rng(0)
    copy = TASKS["copy"](position_coupling=True, max_position=20).instance(rng, 3)
    reverse = TASKS["reverse"](position_coupling=True, max_position=20).instance(rng, 3)
    assert copy.positions == (2, 3, 4, 1, 2, 3, 4)  # a b c > a b c
    assert reverse.positions == (1, 2, 3, 4, 3, 2, 1)  # a b c > c b a


def places(text: str) -> list[int]:
    """Each digit's place read from a number written most significant digit first."""
    return list(range(len(text)))[::-1]


@pytest.mark.parametrize("reversed_operands", [False, True])
def test_every_coupled_instance_gives_one_id_to_one_place(reversed_operands):
    task = Addition(position_coupling=True, max_position=60, reversed_operands=reversed_operands)
    for seed in SEEDS:
        for size in (1, 2, 7, 20):
            instance = task.instance(np.random.default_rng([seed, size]), size)
            question, answer = (s.piece for s in instance.segments)
            a, b = re.fullmatch(r"(\d+)\+(\d+)=", question).groups()
            if reversed_operands:
                a, b = a[::-1], b[::-1]
            assert int(answer[::-1]) == int(a) + int(b)
            ids = iter(instance.positions)
            by_place: dict[int, set[int]] = {}
            for operator, number, reverse in (("+", a, reversed_operands), ("=", b, reversed_operands),
                                              (None, answer[::-1], True)):
                for place in places(number)[::-1] if reverse else places(number):
                    by_place.setdefault(place, set()).add(next(ids))
                if operator is not None:
                    assert next(ids) == 1  # '+' and '=' at the start
            assert all(len(ids_) == 1 for ids_ in by_place.values())  # one id per place
            assert {p: ids_.pop() for p, ids_ in by_place.items()} == {p: p + 2 for p in by_place}


def test_training_starts_ids_and_hints_at_random_offsets_within_range():
    coupled = Addition(position_coupling=True, max_position=30)
    hinted = Addition(index_hints=True)
    shifts, starts = set(), set()
    for seed in range(200):
        rng = np.random.default_rng(seed)
        instance = coupled.instance(rng, 5)
        trained = coupled.for_training(instance, rng)
        shift = {t - p for t, p in zip(trained.positions, instance.positions, strict=True)}
        assert len(shift) == 1 and max(trained.positions) <= 30  # one offset for every id
        shifts |= shift
        instance = hinted.instance(np.random.default_rng(seed), 5)
        trained = hinted.for_training(instance, np.random.default_rng(seed + 1000))
        before, after = ("".join(s.piece for s in i.segments) for i in (instance, trained))
        moved = {HINTS.index(y) - HINTS.index(x) for x, y in zip(before, after, strict=True) if x in HINTS}
        assert len(moved) == 1 and re.sub(f"[{HINTS}]", "", before) == re.sub(f"[{HINTS}]", "", after)
        starts |= moved
    assert shifts == set(range(30 - 6 + 1))  # 5 digits: the largest id 6 (7 with a last carry): [0, 24]
    assert starts == set(range(len(HINTS) - 6 + 1))  # 6 places of 52 letters: [0, 46]


def test_the_options_that_mark_places_are_refused_in_one_line_where_they_do_not_apply():
    with pytest.raises(ValueError, match="^task.position_coupling=True is invalid: applies to task copy \\| "
                                         "reverse \\| addition, not parity$"):
        TaskConfig(name="parity", position_coupling=True)
    with pytest.raises(ValueError, match="^task.index_hints=True is invalid: applies to task addition, not "
                                         "copy$"):
        TaskConfig(name="copy", index_hints=True)
    with pytest.raises(ValueError, match="^task.index_hints=True is invalid: must be false with "
                                         "position_coupling=true"):
        TaskConfig(name="addition", position_coupling=True, index_hints=True)
    with pytest.raises(ValueError, match="^task.max_position=9 is invalid: must be at least train_length "
                                         "\\+ 2 = 10"):
        TaskConfig(name="addition", train_length=8, position_coupling=True, max_position=9)
    with pytest.raises(ValueError, match="^task.train_length=60 is invalid: must be at most 51 with "
                                         "index_hints"):
        TaskConfig(name="addition", train_length=60, index_hints=True)
    with pytest.raises(ValueError, match="^task.position_coupling=True is invalid: needs encodings that take "
                                         "given positions: pos='nope' has no use for them"):
        RunConfig(model={"pos": "nope"}, task={"name": "addition", "position_coupling": True})
    with pytest.raises(ValueError, match="^task.max_position=34 is invalid: must be below "
                                         "model.max_seq_len=32 with pos='learned'"):
        RunConfig(model={"pos": "learned", "max_seq_len": 32},
                  task={"name": "addition", "train_length": 8, "position_coupling": True})
    with pytest.raises(ValueError, match="^train.random_positions=512 is invalid: must be null with "
                                         "task.position_coupling=true"):
        RunConfig(task={"name": "addition", "position_coupling": True}, train={"random_positions": 512})
    assert TaskConfig(name="addition", position_coupling=True).max_position == 4 * 4 + 2  # 4x its 4 digits
    with pytest.raises(ValueError, match="index hints: 60 digits need 61 hint letters, more than the 52"):
        Addition(index_hints=True).instance(np.random.default_rng(0), 60)
