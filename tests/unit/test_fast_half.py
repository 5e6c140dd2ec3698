"""`make test-repeat`: the fast half that it repeats is named by tests/conftest.py (its ``slow`` marker)."""

from __future__ import annotations

import re

from tests.conftest import _SLOW_MODULES, REPO


def test_every_slow_module_named_is_a_test_module_of_the_suite():
    """A module renamed or removed would leave a stale name, and its successor in the fast half unnoticed."""
    missing = [name for name in _SLOW_MODULES if not (REPO / name).is_file()]
    assert missing == [], f"tests/conftest.py _SLOW_MODULES names modules that are not there: {missing}"
    assert list(_SLOW_MODULES) == sorted(set(_SLOW_MODULES)), "_SLOW_MODULES: keep it sorted, each once"


def test_make_test_repeat_runs_the_tests_not_marked_slow_three_times():
    makefile = (REPO / "Makefile").read_text()
    rule = re.search(r"^test-repeat:.*?(?=^\S)", makefile, re.M | re.S)
    assert rule is not None, "the Makefile has no test-repeat target"
    assert '-m "not slow"' in rule.group(0) and "$(REPEAT)" in rule.group(0)
    assert re.search(r"^REPEAT \?= 3$", makefile, re.M)
