"""labutils.exercises.lab06e: check_rank_coords accepts the reference, rejects ParallelDims' own
answer (the learner gets the four sizes only), and rejects the column-major and off-by-one
mistakes with a message naming them (pure arithmetic: no processes)."""
import pytest

from labutils.exercises import lab06e as X
from labutils.exercises.lab06e import check_rank_coords

from .checkers import assert_check, checker_cases

pytestmark = pytest.mark.lab06e


def _library(rank, dims):          # the notebook's worked example shows these calls
    return dims.coords(rank).as_dict(), dims.groups(rank)


def _one_based_coords(rank, dims):
    coords, groups = X.rank_coords(rank, dims)
    return {d: c + 1 for d, c in coords.items()}, groups


def _one_based_groups(rank, dims):
    coords, groups = X.rank_coords(rank, dims)
    return coords, {d: [r + 1 for r in g] for d, g in groups.items()}


def _reversed_groups(rank, dims):
    coords, groups = X.rank_coords(rank, dims)
    return coords, {d: g[::-1] for d, g in groups.items()}


def _short_groups(rank, dims):      # range(size - 1): the last member forgotten
    coords, groups = X.rank_coords(rank, dims)
    return coords, {d: [r for r in g if r == rank or g.index(r) < len(g) - 1]
                    for d, g in groups.items()}


def _without_self(rank, dims):
    coords, groups = X.rank_coords(rank, dims)
    return coords, {d: [r for r in g if r != rank] for d, g in groups.items()}


def _column_major_coords(rank, dims):
    coords, _ = X._column_major(rank, dims)
    return coords, X.rank_coords(rank, dims)[1]


def _stub(rank, dims):
    return None  # FILL ME IN


@pytest.mark.parametrize("answer, verdict", checker_cases(X.rank_coords, {
    "column_major": (X._column_major, "column-major"),
    "column_major_coords": (_column_major_coords, "column-major"),
    "one_based_coords": (_one_based_coords, "one too large"),
    "one_based_groups": (_one_based_groups, "shifted by one"),
    "reversed": (_reversed_groups, "wrong order"),
    "short": (_short_groups, "off-by-one"),
    "without_self": (_without_self, "itself included"),
    "not_a_pair": (lambda rank, dims: [0, 0, 0, 0], "expected a pair"),
    "library": (_library, "raised AttributeError"),
    "stub": (_stub, "not implemented"),
}, passes="passed"))
def test_rank_coords_checker(answer, verdict):
    assert_check(check_rank_coords, answer, verdict)


def test_no_case_is_the_notebooks_worked_example():
    assert all((d.dp, d.tp, d.pp, d.cp, r) != (2, 2, 2, 1, 5) for d, r in X._CASES)
