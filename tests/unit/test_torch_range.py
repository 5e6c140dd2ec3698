"""setup.cfg's torch range is the tested range: its lowest release is ``make test-torch-min``'s pin, its
newest minor ``make test``'s, and trainer/torch_private/'s TESTED says the same."""

from __future__ import annotations

import configparser
import re

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.conftest import REPO
from trainer.torch_private import TESTED


def _declared() -> SpecifierSet:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = [line.split("#")[0].strip() for line in cfg["options.extras_require"]["trainer"].splitlines()]
    (spec,) = [line for line in lines if re.match(r"torch\b", line)]
    return SpecifierSet(spec.removeprefix("torch"))


def _pin(variable: str) -> Version:
    found = re.search(rf"^{variable} \?= torch==(\S+)$", (REPO / "Makefile").read_text(), re.M)
    assert found, f"Makefile: no {variable} ?= torch==X.Y.Z"
    return Version(found[1])


def test_the_declared_range_is_exactly_the_two_tested_releases():
    declared, newest, oldest = _declared(), _pin("TORCH_SPEC"), _pin("TORCH_MIN")
    bounds = {s.operator: Version(s.version) for s in declared}
    assert set(bounds) == {">=", "<"}, f"setup.cfg: torch{declared}: a lower and an upper bound"
    assert bounds[">="] == oldest, (
        f"setup.cfg allows torch {bounds['>=']}, make test-torch-min tests {oldest}"
    )
    assert newest in declared and oldest in declared
    # the upper bound is the minor after the newest tested: every patch release of it, nothing newer
    assert bounds["<"] == Version(f"{newest.major}.{newest.minor + 1}"), (
        f"setup.cfg: torch{declared}, make test tests {newest}: "
        f"the bound must be <{newest.major}.{newest.minor + 1}"
    )
    assert TESTED == (f"{oldest.major}.{oldest.minor}", f"{newest.major}.{newest.minor}"), TESTED


def test_the_suite_runs_on_one_of_the_two_pins():
    import torch

    running = Version(torch.__version__.split("+")[0])
    assert running in (_pin("TORCH_SPEC"), _pin("TORCH_MIN")), f"torch {running} is neither tested pin"
