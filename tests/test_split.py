"""`monet.solver.split`: one budget split among pieces that run one after another, checked against
every combination on small hand-made and random instances (no torch, milliseconds)."""
import itertools
import random

import pytest

from monet.solver.split import Option, split


def _fits(fixed, picked, budget):
    kept = 0
    for f, o in zip(fixed, picked):
        if f + kept + o.peak > budget:
            return False
        kept += o.kept
    return True


def _brute(fixed, options, budget):
    best = None
    for combo in itertools.product(*[range(len(o)) for o in options]):
        picked = [options[k][i] for k, i in enumerate(combo)]
        if _fits(fixed, picked, budget):
            seconds = sum(o.seconds for o in picked)
            if best is None or seconds < best[0] - 1e-12:
                best = (seconds, combo)
    return best


def test_an_earlier_piece_keeps_less_so_that_the_later_one_runs_faster():
    # piece 0: keep everything (8 kept, 1.0 s) or recompute (2 kept, 1.2 s); piece 1 at 10 bytes
    # beside 8 kept must recompute a lot (2.0 s), beside 2 kept it runs plainly (1.0 s)
    first = [Option(peak=10, kept=8, seconds=1.0), Option(peak=6, kept=2, seconds=1.2)]
    second = [Option(peak=10, kept=8, seconds=1.0), Option(peak=4, kept=1, seconds=2.0)]
    chosen = split([0, 0], [first, second], budget=12)
    assert chosen.picks == (1, 0) and chosen.failed is None
    assert chosen.seconds == pytest.approx(2.2) and chosen.peak == 12
    # the first piece as fast as it can be (what solving in order gives) would cost 3.0 s
    assert _fits([0, 0], [first[0], second[1]], 12) and 1.0 + 2.0 > chosen.seconds


def test_fixed_bytes_and_a_piece_that_fits_nothing():
    options = [[Option(5, 5, 1.0)], [Option(5, 0, 1.0)]]
    assert split([0, 0], options, 10).picks == (0, 0)
    assert split([0, 1], options, 10).failed == 1  # 1 fixed + 5 kept + 5 peak > 10
    assert split([6, 0], options, 10).failed == 0
    assert split([0, 0], [[], options[1]], 10).failed == 0
    with pytest.raises(ValueError):
        split([0], options, 10)


def test_the_split_is_the_best_combination_on_random_instances():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 4)
        options = [[Option(peak=rng.randint(1, 40), kept=rng.randint(0, 20), seconds=rng.uniform(0.5, 3.0))
                    for _ in range(rng.randint(1, 4))] for _ in range(n)]
        fixed = [rng.randint(0, 10) for _ in range(n)]
        budget = rng.randint(10, 80)
        best = _brute(fixed, options, budget)
        chosen = split(fixed, options, budget)
        if best is None:
            assert chosen.failed is not None and chosen.picks == ()
            continue
        picked = [options[k][i] for k, i in enumerate(chosen.picks)]
        assert _fits(fixed, picked, budget)
        assert chosen.seconds == pytest.approx(best[0])
