"""Every task's answers, recomputed from the text by code that shares nothing with its generator."""

from __future__ import annotations

import re

import numpy as np
import pytest

from nanoattn.tasks import TASKS, Instance
from nanoattn.tasks.counting import MAX_COUNT
from nanoattn.tasks.retrieval import NEEDLES, VARIABLES_PER_CHAIN

# Filler as the RULER tasks get it: token ids of a corpus split (here the bytes of a made-up text
# without the statements' delimiters).
FILLER = np.frombuffer(b"so shaken as we are, so wan with care, find we a time for frighted peace. " * 40,
                       dtype=np.uint8).astype(np.int64)
SEEDS = range(60)


def draw(name: str, size: int, seed: int, **options) -> Instance:
    task = TASKS[name](**options)
    return task.instance(np.random.default_rng([seed, size]), size, FILLER if task.uses_filler else None)


def sizes(name: str) -> list[int]:
    low = TASKS[name].min_size
    return [low, low + 1, low + 7, 3 * low + 20]


def prompt_and_answer(instance: Instance) -> tuple[str, str]:
    """The text before the (single, final) scored segment, and that segment."""
    *before, last = instance.segments
    assert last.scored and not any(s.scored for s in before)
    return "".join(s.piece if isinstance(s.piece, str) else "" for s in before), last.piece


def filler_tokens(instance: Instance) -> int:
    return sum(len(s.piece) for s in instance.segments if not isinstance(s.piece, str))


def text_tokens(instance: Instance) -> int:
    return sum(len(s.piece) for s in instance.segments)


@pytest.mark.parametrize("name", ["copy", "reverse"])
def test_copy_and_reverse_answer_the_symbols_before_the_separator(name):
    for seed in SEEDS:
        for size in sizes(name):
            prompt, answer = prompt_and_answer(draw(name, size, seed))
            symbols, separator = prompt[:-1], prompt[-1]
            assert separator == ">" and len(symbols) == size and symbols.isalpha()
            assert answer == (symbols if name == "copy" else "".join(reversed(symbols)))


@pytest.mark.parametrize("reversed_answer", [True, False])
def test_addition_answers_the_sum_in_the_chosen_digit_order(reversed_answer):
    for seed in SEEDS:
        for size in sizes("addition"):
            prompt, answer = prompt_and_answer(draw("addition", size, seed, reversed_answer=reversed_answer))
            a, b = re.fullmatch(r"(\d+)\+(\d+)=", prompt).groups()
            assert len(a) == len(b) == size and (size == 1 or a[0] != "0" and b[0] != "0")
            digits = [int(d) for d in (answer[::-1] if reversed_answer else answer)]
            assert sum(d * 10 ** i for i, d in enumerate(reversed(digits))) == int(a) + int(b)
            assert answer[-1 if reversed_answer else 0] != "0" or int(a) + int(b) == 0


def test_parity_answers_whether_the_number_of_ones_is_odd():
    for seed in SEEDS:
        for size in sizes("parity"):
            prompt, answer = prompt_and_answer(draw("parity", size, seed))
            bits = prompt.removesuffix("=")
            assert len(bits) == size and set(bits) <= {"0", "1"}
            odd = False
            for bit in bits:
                odd ^= bit == "1"
            assert answer == ("1" if odd else "0")


def test_selective_copy_answers_the_letters_in_order_without_the_blanks():
    for seed in SEEDS:
        for size in sizes("selective_copy"):
            prompt, answer = prompt_and_answer(draw("selective_copy", size, seed))
            body = prompt.removesuffix(">")
            assert len(body) == size and set(body) - set("abcdefghijklmnop") <= {"."}
            assert answer == re.sub(r"\.", "", body) and answer


def test_counting_answers_how_often_the_queried_letter_occurs():
    for seed in SEEDS:
        for size in sizes("counting"):
            prompt, answer = prompt_and_answer(draw("counting", size, seed))
            body, letter = re.fullmatch(r"([a-e]+)\?([a-e])=", prompt).groups()
            assert len(body) == size
            assert int(answer) == sum(1 for c in body if c == letter)
            assert 1 <= int(answer) <= min(MAX_COUNT, size)


@pytest.mark.parametrize("ignore_prob", [0.98, 0.8, 0.1])
def test_flip_flop_reads_are_scored_and_answer_the_last_written_bit(ignore_prob):
    reads = 0
    for seed in SEEDS:
        for size in sizes("flip_flop"):
            instance = draw("flip_flop", size, seed, ignore_prob=ignore_prob)
            text = "".join(s.piece for s in instance.segments)
            pairs = [text[i:i + 2] for i in range(0, len(text), 2)]
            assert len(pairs) == size and pairs[0][0] == "w" and pairs[-1][0] == "r"
            expected = []
            memory = None
            for op, bit in pairs:
                assert op in "wir" and bit in "01"
                if op == "w":
                    memory = bit
                elif op == "r":
                    expected.append(memory)
                    assert bit == memory
            assert [s.piece for s in instance.segments if s.scored] == expected
            reads += len(expected)
    assert reads > len(SEEDS) * 4  # every instance reads at least once, the last instruction


def test_flip_flop_mixes_instructions_in_the_papers_proportions():
    instance = draw("flip_flop", 20_002, 0, ignore_prob=0.8)
    ops = "".join(s.piece for s in instance.segments)[2:-2:2]
    assert abs(ops.count("i") / len(ops) - 0.8) < 0.01
    assert abs(ops.count("w") / len(ops) - 0.1) < 0.01


def test_multikey_needle_answers_the_asked_keys_value_among_distinct_needles():
    for seed in SEEDS:
        for size in sizes("multikey_needle"):
            instance = draw("multikey_needle", size, seed)
            prompt, answer = prompt_and_answer(instance)
            needles = dict(re.findall(r"<([A-Z]{3})=(\d{4})>", prompt))
            assert len(needles) == NEEDLES and len(set(needles.values())) == NEEDLES
            asked = re.fullmatch(r".*\?([A-Z]{3})=", prompt, re.S).group(1)
            assert answer == needles[asked]
            assert text_tokens(instance) == size and filler_tokens(instance) == size - 4 * 10 - 5 - 4


def test_variable_tracking_answers_every_variable_holding_the_value_in_chain_order():
    for seed in SEEDS:
        for size in sizes("variable_tracking"):
            instance = draw("variable_tracking", size, seed)
            prompt, answer = prompt_and_answer(instance)
            value_of: dict[str, str] = {}
            order = []
            for name, source in re.findall(r"<([A-Z]{2})=([A-Z]{2}|\d{4})>", prompt):
                assert name not in value_of
                value_of[name] = source if source.isdigit() else value_of[source]  # defined before use
                order.append(name)
            asked = re.fullmatch(r".*\?(\d{4}):", prompt, re.S).group(1)
            holders = [name for name in order if value_of[name] == asked]
            assert len(holders) == VARIABLES_PER_CHAIN and len(order) == 2 * VARIABLES_PER_CHAIN
            assert answer == ",".join(holders)
            assert text_tokens(instance) == size


def test_mqar_queries_every_key_once_and_scores_its_value():
    for seed in SEEDS:
        for size in [*sizes("mqar"), 52]:
            context, *queries = draw("mqar", size, seed).segments
            assert not context.scored and context.piece.endswith(">")
            pairs = context.piece[:-1]
            stored = dict(zip(pairs[::2], pairs[1::2], strict=True))
            assert len(stored) == size and all(k.isalpha() and v.isdigit() for k, v in stored.items())
            keys, values = queries[::2], queries[1::2]
            assert not any(k.scored for k in keys) and all(v.scored for v in values)
            assert sorted(k.piece for k in keys) == sorted(stored)
            assert all(stored[k.piece] == v.piece for k, v in zip(keys, values, strict=True))
    with pytest.raises(ValueError, match=r"^task mqar: size=53 pairs is invalid: at most 52, one letter"):
        draw("mqar", 53, 0)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_seed_reproduces_its_instance_and_other_seeds_give_others(name):
    def key(instance: Instance) -> list:
        return [(s.piece if isinstance(s.piece, str) else s.piece.tolist(), s.scored)
                for s in instance.segments]

    size = TASKS[name].min_size + 9
    assert key(draw(name, size, 3)) == key(draw(name, size, 3))
    assert len({str(key(draw(name, size, seed))) for seed in range(20)}) >= 15


@pytest.mark.parametrize("name", sorted(TASKS))
def test_instances_stay_within_max_tokens_and_the_alphabet(name):
    task = TASKS[name]()
    for seed in SEEDS:
        for size in sizes(name):
            instance = draw(name, size, seed)
            assert text_tokens(instance) <= task.max_tokens(size)
            text = "".join(s.piece for s in instance.segments if isinstance(s.piece, str))
            assert set(text) <= set(task.alphabet)


def test_a_filler_task_refuses_a_size_without_room_or_a_missing_filler():
    task = TASKS["multikey_needle"]()
    with pytest.raises(ValueError, match="size 30 leaves no room"):
        task.instance(np.random.default_rng(0), 30, FILLER)
    with pytest.raises(ValueError, match="needs filler token ids"):
        task.instance(np.random.default_rng(0), 64, None)
