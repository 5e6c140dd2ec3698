"""The fake Kubernetes API server, kept importable from here: it lives in ``tests.kubernetes.fakeapi``."""

from tests.kubernetes.fakeapi import (
    ApiError,
    FakeKubernetesApiServer,
    matches,
    merge_patch,
    scheduling_problem,
)

__all__ = ["ApiError", "FakeKubernetesApiServer", "matches", "merge_patch", "scheduling_problem"]
