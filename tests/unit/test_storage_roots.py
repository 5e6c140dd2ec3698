"""Where a trigger may point the worker and the pods: a DAG's storage_roots bound checkpoint_uri, dataset and
init_from, so that a trigger form cannot read or write another place of the machine or the bucket."""

from __future__ import annotations

import pytest

from airflow_dtrain.operators.prepare_data import DataError, PrepareDataOperator
from airflow_dtrain.trust.roots import within_roots
from airflow_dtrain.job.spec import JobSpec
from airflow_dtrain.trust.limits import Limits
from airflow_dtrain.errors import SpecError


def test_a_path_is_within_a_root_only_after_normalising_it(tmp_path):
    root = str(tmp_path / "data")
    assert within_roots(f"{root}/corpus.jsonl", (root,))
    assert within_roots(f"file://{root}/corpus.jsonl", (root,))
    assert not within_roots(f"{root}/../secrets.txt", (root,))  # climbs out
    assert not within_roots(f"{root}-other/x", (root,))  # a sibling with the same prefix
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "link").symlink_to("/etc")
    assert not within_roots(f"{root}/link/passwd", (root,))  # a link out of the root
    assert within_roots("s3://ml-data/corpus/a.jsonl", ("s3://ml-data/corpus",))
    assert not within_roots("s3://ml-data/corpus-evil/a.jsonl", ("s3://ml-data/corpus",))
    assert not within_roots("s3://ml-data/corpus/../private/x", ("s3://ml-data/corpus",))
    assert not within_roots("s3://ml-data/corpus/a.jsonl", (root,))


def test_the_train_task_refuses_a_trigger_pointing_outside(tmp_path):
    limits = Limits(storage_roots=(str(tmp_path),))
    inside = JobSpec.from_arguments(checkpoint_uri=str(tmp_path / "ckpt"))
    limits.check(inside)
    for argument, value in (("checkpoint_uri", "/var/lib/other-team/ckpt"), ("dataset", "/etc"),
                            ("init_from", "s3://someone-elses-bucket/llama")):  # fmt: skip
        spec = JobSpec.from_arguments(**{"checkpoint_uri": str(tmp_path / "ckpt"), argument: value})
        with pytest.raises(SpecError, match=rf"^{argument}: '{value}' is outside the storage roots"):
            limits.check(spec)
    with pytest.raises(
        SpecError, match=r"limits.storage_roots: expected absolute paths or s3:// prefixes, got 'data'"
    ):
        Limits(storage_roots=("data",))


def test_prepare_data_refuses_to_read_outside(tmp_path):
    op = PrepareDataOperator(task_id="prepare_data", dataset="/etc/hostname", tokenizer="",
                             output_root=str(tmp_path / "out"), allowed_roots=[str(tmp_path)])  # fmt: skip
    with pytest.raises(DataError, match=r"^dataset: '/etc/hostname' is outside the storage roots"):
        op.execute({})
    assert not (tmp_path / "out").exists()  # nothing read, nothing written
    builtin = PrepareDataOperator(task_id="p", dataset="builtin", tokenizer="", allowed_roots=[str(tmp_path)])
    assert builtin.execute({}) == "builtin"
