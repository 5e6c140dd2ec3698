"""OpenLineage: which data and which model went into a training job, and where its checkpoints went.

Used only when the OpenLineage provider (``apache-airflow-providers-openlineage``) is installed:
its extractor calls the operator's ``get_openlineage_facets_on_complete``, which lands here, and
nothing of it is imported otherwise. Dataset names follow OpenLineage's naming conventions: an
``s3://bucket/key`` is namespace ``s3://bucket``, name ``key``; a local path (or ``file://``) is
namespace ``file``, name the absolute path.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from airflow_dtrain.job.spec import JobSpec

BUILTIN = "builtin"
"""The bundled demo corpus: part of the package, not a dataset anyone else produced or reads."""


def dataset_name(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of a storage URI, as OpenLineage names datasets."""
    parts = urlsplit(uri)
    if parts.scheme in ("", "file"):
        return "file", os.path.abspath(parts.path if parts.scheme else uri).rstrip("/") or "/"
    return f"{parts.scheme}://{parts.netloc}", parts.path.strip("/")


def training_lineage(spec: JobSpec) -> Any:
    """The ``OperatorLineage`` of a training job: in, its token store and its ``init_from`` model (when it
    has them); out, its checkpoint directory (what evaluation promotes and exports)."""
    from airflow.providers.common.compat.openlineage.facet import Dataset
    from airflow.providers.openlineage.extractors import OperatorLineage

    def dataset(uri: str) -> Any:
        namespace, name = dataset_name(uri)
        return Dataset(namespace=namespace, name=name)

    train = spec.train
    inputs = [dataset(uri) for uri in (train.data.dataset, train.model.init_from) if uri and uri != BUILTIN]
    outputs = [dataset(train.checkpoint.uri)] if train.checkpoint.uri else []
    return OperatorLineage(inputs=inputs, outputs=outputs)
