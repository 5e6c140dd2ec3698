"""``python -m airflow_dtrain render`` (``airflow dtrain render``): a pod group's Kubernetes objects as YAML.

    python -m airflow_dtrain render --backend kubernetes --num-nodes 2 --gpus-per-node 8 \\
        --image ghcr.io/acme/dtrain:0.1.0 --checkpoint-uri s3://bucket/run [--spec spec.yaml] \\
        [--capacity spot --zone us-east-1a --instance-type p5.48xlarge] | kubectl apply -f -

``--spec`` is a ``JobSpec`` as JSON or YAML (``JobSpec.to_dict()``, any part of it);
the flags win over it. ``--policy`` is the platform admin's policy, the connection extra's
``dtrain_policy`` (a file, JSON or YAML). What is printed is exactly what ``FSDPTrainOperator`` with
``backend="kubernetes"`` creates for the same spec on a connection with that policy (none: the defaults).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from airflow_dtrain.render_args import DEFAULT_CHECKPOINT as _DEFAULT_CHECKPOINT, render_args
from airflow_dtrain.job.spec import JobSpec
from airflow_dtrain.errors import SpecError

if TYPE_CHECKING:
    from airflow_dtrain.kubernetes.policy import KubernetesPolicy


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the trainer config) as readable ``|`` blocks."""


_Dumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar(
        "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None
    ),
)


def _load_mapping(flag: str, path: str | None, what: str) -> dict[str, Any]:
    if not path:
        return {}
    data = yaml.safe_load(Path(path).read_text())  # YAML is a superset of JSON
    if not isinstance(data, dict):
        raise SpecError(f"{flag} {path}: expected a mapping ({what}), got {type(data).__name__}")
    return data


def _load_spec(path: str | None) -> dict[str, Any]:
    return _load_mapping("--spec", path, "a JobSpec")


def load_policy(path: str | None) -> KubernetesPolicy:
    """``--policy``: the admin's policy as the connection extra's ``dtrain_policy`` holds it; none: the
    defaults (what a connection without one gives)."""
    from airflow_dtrain.kubernetes.policy import POLICY_EXTRA, KubernetesPolicy

    data = _load_mapping("--policy", path, POLICY_EXTRA)
    return KubernetesPolicy.from_extra({POLICY_EXTRA: data} if path else None)


def build_spec(args: argparse.Namespace) -> JobSpec:
    """The spec file, then the flags over it."""
    data = _load_spec(args.spec)
    data["backend"] = args.backend
    train = data.setdefault("train", {})
    if args.num_nodes is not None:
        data["num_nodes"] = args.num_nodes
    if args.gpus_per_node is not None:
        data.setdefault("resources", {})["gpus_per_node"] = args.gpus_per_node
        data["procs_per_node"] = max(1, args.gpus_per_node)
    if args.image:
        data.setdefault("kubernetes", {})["image"] = args.image
    if args.namespace:
        data.setdefault("kubernetes", {})["namespace"] = args.namespace
    if args.flavor:
        train.setdefault("model", {})["flavor"] = args.flavor
    for field in ("capacity", "zone", "instance_type"):  # where the budget decision chose the price
        if getattr(args, field, None):
            data[field] = getattr(args, field)
    if args.checkpoint_uri:
        train.setdefault("checkpoint", {})["uri"] = args.checkpoint_uri
    elif not train.get("checkpoint", {}).get("uri"):
        train.setdefault("checkpoint", {})["uri"] = _DEFAULT_CHECKPOINT.format(name=args.name)
    if "global_batch_size" not in train:
        # one micro-batch per rank per step unless the spec says otherwise: valid for any world size
        world = int(data.get("num_nodes", 1)) * int(data.get("procs_per_node", 1))
        train["global_batch_size"] = world * int(train.get("micro_batch_size", 2))
    return JobSpec.from_dict(data)


def render(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_dtrain render", description=__doc__.split("\n\n")[0]
    )
    for flags, kwargs in render_args():
        parser.add_argument(*flags, **kwargs)
    return run_render(parser.parse_args(argv))


def run_render(args: argparse.Namespace) -> int:
    """Print the objects of ``args`` (``render_args()``'s); 2 with the reason on stderr for a refused spec."""
    from airflow_dtrain.kubernetes.objects import render_group

    try:
        spec = build_spec(args)
        namespace, policy = spec.kubernetes.namespace or "default", load_policy(args.policy)
        policy.check(spec, namespace=namespace)  # what the launcher refuses before any API call
        objects = render_group(args.name, spec, namespace=namespace,
                               compile_cache_claim=policy.compile_cache_claim)  # fmt: skip
    except (SpecError, ValueError, OSError, yaml.YAMLError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    header = (
        f"# pod group {args.name}: {spec.num_nodes} node(s) x {spec.procs_per_node} process(es), "
        "rendered by airflow-dtrain\n"
    )
    if spec.train.checkpoint.uri == _DEFAULT_CHECKPOINT.format(name=args.name):
        header += "# checkpoint.uri is a placeholder: pass --checkpoint-uri s3://<bucket>/<prefix>\n"
    sys.stdout.write(header + yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, explicit_start=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "render":
        print(
            "usage: python -m airflow_dtrain render --backend kubernetes [options]  (see render --help)",
            file=sys.stderr,
        )
        return 2
    return render(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
