"""Every Param of every bundled DAG makes a trigger form that works with its own defaults.

The Airflow UI builds the trigger form from the DAG's params. It treats a Param as *required*
when its schema has a ``type`` that is not nullable (``"string"``, not ``["null", "string"]``),
and a required field whose value is ``None`` or ``""`` keeps the Trigger button disabled
(airflow/ui: ``isRequired`` and the flexible form's section errors). So an optional text field
must be ``Param(None, type=["null", "string"])``, never ``Param("", type="string")``.

The form also shows ``title`` (else the param's key) as the label, ``description`` under the
field, and groups the fields in accordions by ``section`` (params without one go into the
form's default "Run Parameters" section).
"""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.definitions._internal.types import is_arg_set

from tests.conftest import REPO


@pytest.fixture(scope="module")
def dags() -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}, f"DAG import errors: {bag.import_errors}"
    assert bag.dags, f"no DAGs found in {REPO / 'dags'}"
    return bag.dags


def _params(dags: dict[str, Any]):
    """(dag_id, name, Param) for every Param of every DAG."""
    for dag_id, dag in sorted(dags.items()):
        for name in dag.params:
            yield dag_id, name, dag.params.get_param(name)


def _ui_requires(schema: dict) -> bool:
    """The UI's ``isRequired``: a ``type`` is given and it does not admit ``null``."""
    kind = schema.get("type")
    return bool(kind) and not (isinstance(kind, list) and "null" in kind)


def _fail(problems: list[str], what: str) -> None:
    if problems:
        pytest.fail(f"{len(problems)} param(s) {what}:\n  " + "\n  ".join(problems), pytrace=False)


def test_every_param_default_validates_against_its_schema(dags):
    """Each default passes the validation Airflow itself runs (``Param.resolve``: jsonschema with
    a FormatChecker), so a run triggered with the defaults is accepted."""
    from jsonschema import FormatChecker
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    problems = []
    for dag_id, name, param in _params(dags):
        where = f"DAG {dag_id!r}, param {name!r}"
        if not is_arg_set(param.value):
            problems.append(f"{where}: has no default, so the trigger form cannot be sent as it opens")
            continue
        cls = validator_for(param.schema)
        try:
            cls.check_schema(param.schema)
        except SchemaError as err:
            problems.append(f"{where}: its schema is not valid JSON Schema: {err.message}")
            continue
        for error in cls(param.schema, format_checker=FormatChecker()).iter_errors(param.value):
            problems.append(f"{where}: default {param.value!r} does not validate: {error.message}")
    _fail(problems, "with a default that fails its own schema")


def test_no_param_is_required_and_empty_by_default(dags):
    """No optional text field is a non-nullable ``"string"`` with ``""`` (or ``None``) as default:
    the UI reads it as a missing required value and keeps the Trigger button disabled."""
    problems = []
    for dag_id, name, param in _params(dags):
        if not is_arg_set(param.value):
            continue  # reported by the test above
        if _ui_requires(param.schema) and param.value in (None, ""):
            problems.append(
                f"DAG {dag_id!r}, param {name!r}: type={param.schema.get('type')!r} with default "
                f"{param.value!r} -- the trigger form reads it as a missing required value and disables "
                f"Trigger; make it nullable: Param(None, type=['null', {param.schema.get('type')!r}], ...)"
            )
    _fail(problems, "that block the trigger form with their own defaults")


def test_every_param_has_a_title_and_a_description(dags):
    problems = []
    for dag_id, name, param in _params(dags):
        missing = [
            what
            for what, value in (("title", param.schema.get("title")), ("description", param.description))
            if not (isinstance(value, str) and value.strip())
        ]
        if missing:
            problems.append(f"DAG {dag_id!r}, param {name!r}: no {' and no '.join(missing)}")
    _fail(problems, "without a title or a description (the form would show the bare key)")


def test_every_param_has_a_section(dags):
    """The form groups params into accordions by their schema's ``section``."""
    problems = [
        f"DAG {dag_id!r}, param {name!r}: no section"
        for dag_id, name, param in _params(dags)
        if not (isinstance(param.schema.get("section"), str) and param.schema["section"].strip())
    ]
    _fail(problems, "without a section (they would all land in the form's default 'Run Parameters')")


def test_no_dag_offers_the_program_on_its_trigger_form_and_a_run_cannot_set_it(dags):
    """The program every process runs (FSDPTrainOperator's entrypoint) is the DAG author's alone."""
    from airflow_dtrain.params import UnknownConfKeys, param_schema, reject_unknown_conf

    assert not [dag_id for dag_id, name, _ in _params(dags) if name in ("entrypoint", "limits")]
    for dag_id in ("train_llama", "sweep_llama"):  # the DAGs that check their conf
        with pytest.raises(
            UnknownConfKeys,
            match=r"dag_run.conf: key 'entrypoint' is refused: the program every "
            r"process runs is set by the DAG author",
        ):
            reject_unknown_conf({"steps": 10, "entrypoint": ["/tmp/not-the-authors.py"]}, dags[dag_id].params)
    with pytest.raises(KeyError, match=r"entrypoint: .* never a trigger-form param"):
        param_schema("entrypoint")
