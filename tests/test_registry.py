"""The exercise checkers' registry: every checker the course map (labutils.course) names is
``check_<name>`` in its lab's module and is what ``lu.check_<name>`` finds; every ``check_*``
defined in ``labutils/exercises/lab*.py`` is registered, under its own lab; an unknown
``lu.check_<name>`` is an AttributeError that lists the exercises. Imports only: no process."""
import glob
import importlib
import os
import re

import pytest

import labutils as lu
from labutils import course

pytestmark = pytest.mark.lab01   # the course map, like tests/test_course.py

EXERCISES = os.path.join(os.path.dirname(os.path.abspath(lu.__file__)), "exercises")
LAB_MODULES = sorted(f"labutils.exercises.{os.path.basename(path)[:-3]}"
                     for path in glob.glob(os.path.join(EXERCISES, "lab*.py")))


def _defined_checkers(module):
    """The check_* functions defined in ``module`` itself (not imported into it)."""
    return {name for name, obj in vars(module).items()
            if name.startswith("check_") and callable(obj)
            and getattr(obj, "__module__", None) == module.__name__}


def test_registry_lists_each_checker_once_and_each_lab_module_exists():
    names = course.checkers()
    assert names, "the course map registers no checker"
    assert len(names) == len(set(names)), f"a checker registered twice: {names}"
    for lab in course.LABS:
        if lab.checkers:
            assert lab.exercises in LAB_MODULES, f"{lab.notebook}: no module {lab.exercises}"


@pytest.mark.parametrize("name", course.checkers())
def test_every_registered_checker_exists_in_its_module(name):
    path = course.checker_module(name)
    assert path is not None, f"check_{name} is registered but has no module"
    module = importlib.import_module(path)
    fn = getattr(module, f"check_{name}", None)
    assert callable(fn), f"{path} defines no check_{name}"
    assert fn.__module__ == path, f"check_{name} is defined in {fn.__module__}, not {path}"
    assert getattr(lu, f"check_{name}") is fn
    assert f"check_{name}" in dir(lu)


@pytest.mark.parametrize("path", LAB_MODULES, ids=lambda path: path.rsplit(".", 1)[1])
def test_every_defined_checker_is_registered_under_its_lab(path):
    module = importlib.import_module(path)
    defined = _defined_checkers(module)
    assert defined, f"{path} defines no check_* function"
    for fn_name in sorted(defined):
        name = fn_name[len("check_"):]
        assert name in course.checkers(), (
            f"{path}.{fn_name} is not in labutils.course: add {name!r} to its lab's checkers")
        assert course.checker_module(name) == path, (
            f"{fn_name} is defined in {path} but registered under {course.checker_module(name)}")


def test_unknown_checker_is_an_attribute_error_listing_the_exercises():
    assert course.checker_module("no_such_exercise") is None
    with pytest.raises(AttributeError) as info:
        lu.check_no_such_exercise
    message = str(info.value)
    listed = re.findall(r"check_\w+", message)
    assert listed[0] == "check_no_such_exercise", message
    assert listed[1:] == [f"check_{name}" for name in course.checkers()], message
    assert not hasattr(lu, "check_no_such_exercise")
