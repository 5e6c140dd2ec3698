"""A run can point SpotInterruptionSensor only at the queues and namespaces its DAG and the admin allow.

Whoever presses Trigger sets the sensor's queue (the bundled DAG's ``interruption_queue_url``) and
namespace (``kubernetes.namespace``). Reading another team's queue would take its spot warnings; so the
queue must be on the admin's ``[dtrain] interruption_queues`` (and the author's ``interruption_queues``),
and the namespace within the DAG's ``kubernetes`` and the connection's ``dtrain_policy``, both checked
before any call. Moto's SQS on 127.0.0.1 and a fake Kubernetes API server (which records each request)
show that nothing was called: the message is still in the queue, received by nobody, and the API server
saw no request.
"""

from __future__ import annotations

import json

import pytest

from airflow_dtrain.errors import SpecError
from airflow_dtrain.sensors.spot_interruption import SpotInterruptionSensor
from airflow_dtrain.triggers.spot_interruption import SpotInterruptionTrigger
from tests.conftest import run_trigger
from tests.kubernetes.conftest import launch_debug_group
from tests.kubernetes.fake_apiserver import FakeKubernetesApiServer
from tests.spot.events import spot_warning

OURS, OTHER = "i-0a1b2c3d4e5f60001", "i-0fedcba987654321f"
GROUP, NAMESPACE = "watched-r0", "training"
QUEUES_ENV = "AIRFLOW__DTRAIN__INTERRUPTION_QUEUES"
FORM_FIELD = "{{ params.interruption_queue_url or None }}"
BY_THE_DAG = (
    "kubernetes.namespace: 'team-b' is not allowed by this DAG (allowed: {}; kubernetes.allowed_namespaces)"
)
BY_THE_ADMIN = (
    "{}: 'team-b' is not allowed on this cluster (the admin's dtrain_policy.allowed_namespaces: training)"
)


def _untouched(client, url) -> list[tuple[str, str]]:
    """(body, receive count) of every message, received now by a consumer of its own; raises if some
    message is still hidden (received by someone else within the visibility timeout)."""
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0", attributes
    messages = client.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, AttributeNames=["ApproximateReceiveCount"]
    ).get("Messages", [])
    return sorted((m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in messages)


def _sensor(url, tmp_path, **kwargs) -> SpotInterruptionSensor:
    arguments = {
        "task_id": "spot_watch",
        "group": "watched",
        "instance_ids": [OURS],
        "sqs_queue_url": url,
        "local_state_dir": str(tmp_path),
        "wait_time_seconds": 0,
    }
    return SpotInterruptionSensor(**{**arguments, **kwargs})


@pytest.fixture
def warning_in_queue(sqs_queue):
    """A queue holding one spot warning for our instance: (client, url, body)."""
    client, url = sqs_queue
    body = json.dumps(spot_warning(OURS))
    client.send_message(QueueUrl=url, MessageBody=body)
    return client, url, body


@pytest.mark.parametrize(
    ("admin_list", "listed"),
    [
        (None, "[dtrain] interruption_queues is not set"),
        (
            "https://sqs.us-east-1.amazonaws.com/111122223333/spot-events",
            "the admin's [dtrain] interruption_queues: https://sqs.us-east-1.amazonaws.com/111122223333/spot-events",
        ),
    ],
)
def test_a_queue_not_on_the_admins_list_is_refused_before_any_sqs_call(
    warning_in_queue, tmp_path, monkeypatch, admin_list, listed
):
    client, url, body = warning_in_queue
    if admin_list is None:
        monkeypatch.delenv(QUEUES_ENV)
    else:
        monkeypatch.setenv(QUEUES_ENV, admin_list)
    sensor = _sensor(FORM_FIELD, tmp_path)
    sensor.sqs_queue_url = url  # as the trigger form's interruption_queue_url renders

    with pytest.raises(SpecError) as refused:
        sensor.execute({})

    message = str(refused.value)
    assert message.startswith(
        f"SpotInterruptionSensor(task_id='spot_watch'): sqs_queue_url (from '{FORM_FIELD}'): "
        f"{url!r} is not an allowed interruption queue ({listed})."
    )
    assert "the platform admin adds the queue URL, of a queue only the spot watch reads," in message
    assert "AIRFLOW__DTRAIN__INTERRUPTION_QUEUES" in message
    assert _untouched(client, url) == [(body, "1")]  # nobody received it before this look


def test_the_dag_authors_list_narrows_the_admins(warning_in_queue, tmp_path, monkeypatch):
    client, url, body = warning_in_queue
    account = url[: url.rfind("/") + 1]
    elsewhere = f"{account}team-b-spot-events"
    monkeypatch.setenv(
        QUEUES_ENV, f" {url} , {elsewhere}, https://sqs.us-east-1.amazonaws.com/111122223333/q"
    )

    with pytest.raises(
        SpecError, match=r"sqs_queue_url: .* is not allowed by this DAG \(interruption_queues: "
    ):
        _sensor(url, tmp_path, interruption_queues=[elsewhere]).execute({})
    assert _untouched(client, url) == [(body, "1")]

    # On both lists: the watch is set up with it.
    assert (
        _sensor(url, tmp_path, interruption_queues=[url, elsewhere])._watch_kwargs({})["sqs_queue_url"] == url
    )
    with pytest.raises(SpecError, match=r"interruption_queues: not a queue URL .* got 'sqs://q'"):
        _sensor(url, tmp_path, interruption_queues=["sqs://q"])


def test_a_bad_admin_entry_is_refused_naming_the_option(warning_in_queue, tmp_path, monkeypatch):
    client, url, body = warning_in_queue
    monkeypatch.setenv(QUEUES_ENV, f"{url},https://sqs.us-east-1.amazonaws.com/")
    with pytest.raises(SpecError, match=r"\[dtrain\] interruption_queues: not a queue URL .*amazonaws.com/'"):
        _sensor(url, tmp_path).execute({})
    assert _untouched(client, url) == [(body, "1")]


def test_the_triggerer_refuses_a_queue_the_admin_no_longer_allows(warning_in_queue, tmp_path, monkeypatch):
    """The sensor deferred with an allowed queue; the triggerer reads its own configuration first."""
    client, url, body = warning_in_queue
    watch_kwargs = _sensor(url, tmp_path)._watch_kwargs({})
    watch_kwargs["source"] = list(watch_kwargs["source"].serialize())
    monkeypatch.setenv(QUEUES_ENV, url.rsplit("/", 1)[0] + "/other-queue")

    event = run_trigger(SpotInterruptionTrigger(watch_kwargs=watch_kwargs, poll_interval=0.1), timeout=30)

    assert event["status"] == "error"
    assert event["message"].startswith(f"sqs_queue_url: {url!r} is not an allowed interruption queue")
    assert _untouched(client, url) == [(body, "1")]


# -- on a cluster --------------------------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A fake API server; its connection's extra may carry the admin's policy (``cluster.set_policy``)."""
    server = FakeKubernetesApiServer().start()
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")

    def set_policy(policy: dict | None) -> None:
        extra = {"kube_config_path": str(kubeconfig), **({"dtrain_policy": policy} if policy else {})}
        monkeypatch.setenv(
            "AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps({"conn_type": "kubernetes", "extra": extra})
        )

    server.set_policy = set_policy
    set_policy(None)
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    for name in (NAMESPACE, "team-b"):
        api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield server
    server.stop()


def _asked(cluster) -> list[str]:
    """The pods asked to checkpoint now (each PATCH of a pod: its checkpoint-now annotation)."""
    return [
        path.rsplit("/", 1)[-1] for method, path in cluster.requests if method == "PATCH" and "/pods/" in path
    ]


def test_an_allowed_queue_acts_on_our_warning_and_leaves_the_others_for_their_consumers(
    cluster, sqs_queue, tmp_path, monkeypatch
):
    client, url = sqs_queue
    monkeypatch.setenv(QUEUES_ENV, url)  # a queue the spot watch alone reads (foreign messages still left)
    launch_debug_group(GROUP, tmp_path, namespace=NAMESPACE)
    cluster.run(GROUP, namespace=NAMESPACE)
    foreign, ours, garbage = json.dumps(spot_warning(OTHER)), json.dumps(spot_warning(OURS)), "not json"
    for body in (foreign, ours, garbage):
        client.send_message(QueueUrl=url, MessageBody=body)
    sensor = SpotInterruptionSensor(
        task_id="spot_watch",
        group="watched",
        instance_ids=[OURS],
        sqs_queue_url=url,
        backend="kubernetes",
        namespace=NAMESPACE,
        wait_time_seconds=0,
    )

    result = sensor.poke({})

    assert result.is_done
    assert [(n["kind"], n["instance_id"]) for n in result.xcom_value["notices"]] == [
        ("spot-interruption", OURS)
    ]
    assert len(_asked(cluster)) == 2  # both pods of the group asked to checkpoint now
    # Ours is deleted; another team's warning and the malformed message were received once by the sensor
    # and released at once (the queue's visibility timeout is 30 s): another consumer receives them now.
    assert _untouched(client, url) == sorted([(foreign, "2"), (garbage, "2")])


@pytest.mark.parametrize(
    ("kubernetes", "policy", "namespace", "refusal"),
    [
        # the trigger chooses a namespace the DAG's author did not allow
        ({"namespace": NAMESPACE}, None, "team-b", BY_THE_DAG.format("'training'")),
        # no kubernetes settings: a templated namespace is a run's choice, and none is allowed
        (None, None, "team-b", BY_THE_DAG.format("none")),
        # the DAG allows it, the admin does not
        (
            {"namespace": NAMESPACE, "allowed_namespaces": ["team-b"]},
            {"allowed_namespaces": [NAMESPACE]},
            "team-b",
            BY_THE_ADMIN.format("kubernetes.namespace"),
        ),
        # the DAG lets runs choose a namespace the admin does not allow: refused even when this run does not
        (
            {"namespace": NAMESPACE, "allowed_namespaces": ["team-b"]},
            {"allowed_namespaces": [NAMESPACE]},
            None,
            BY_THE_ADMIN.format("kubernetes.allowed_namespaces"),
        ),
    ],
)
def test_a_namespace_the_dag_or_the_admin_does_not_allow_is_refused_before_any_api_call(
    cluster, tmp_path, kubernetes, policy, namespace, refusal
):
    launch_debug_group(GROUP, tmp_path, namespace=NAMESPACE)
    cluster.run(GROUP, namespace=NAMESPACE)
    cluster.set_policy(policy)
    sensor = SpotInterruptionSensor(
        task_id="spot_watch",
        group="watched",
        backend="kubernetes",
        kubernetes=kubernetes,
        namespace="{{ params.kubernetes.get('namespace') }}",
    )
    sensor.namespace = namespace  # as the trigger form's kubernetes.namespace renders
    calls = len(cluster.requests)

    with pytest.raises(SpecError) as refused:
        sensor.execute({})

    assert str(refused.value).startswith(f"SpotInterruptionSensor(task_id='spot_watch'): {refusal}")
    assert len(cluster.requests) == calls  # not even a look at the group or its pods


def test_an_allowed_namespace_is_watched(cluster, tmp_path):
    """The same set-up within both bounds: the sensor does look (so the tests above could see a call)."""
    launch_debug_group(GROUP, tmp_path, namespace="team-b")
    cluster.run(GROUP, namespace="team-b")
    cluster.set_policy({"allowed_namespaces": [NAMESPACE, "team-b"]})
    sensor = SpotInterruptionSensor(
        task_id="spot_watch",
        group="watched",
        backend="kubernetes",
        kubernetes={"namespace": NAMESPACE, "allowed_namespaces": ["team-b"]},
        namespace="{{ params.kubernetes.get('namespace') }}",
    )
    sensor.namespace = "team-b"
    calls = len(cluster.requests)

    assert sensor.poke({}).is_done is False  # the group runs there, no notice yet
    assert any(path.startswith("/apis/batch/v1/namespaces/team-b/") for _, path in cluster.requests[calls:])


def test_a_namespace_written_in_the_dag_outside_its_kubernetes_settings_fails_at_parse():
    with pytest.raises(
        SpecError, match=r"task_id='w'\): kubernetes.namespace: 'team-b' is not allowed by this DAG"
    ):
        SpotInterruptionSensor(
            task_id="w",
            group="g",
            backend="kubernetes",
            kubernetes={"namespace": NAMESPACE},
            namespace="team-b",
        )
    with pytest.raises(SpecError, match=r"kubernetes: a template here may not read params"):
        SpotInterruptionSensor(
            task_id="w", group="g", backend="kubernetes", kubernetes={"namespace": "{{ params.ns }}"}
        )


def test_an_account_prefix_is_refused_and_a_shared_queue_keeps_every_message(
    sqs_queue, tmp_path, monkeypatch
):
    """Another consumer's queue, with a dead-letter queue after 2 receives: an account prefix on the admin's
    list would let a run point the watch at it, and each poke would count a receive of that consumer's
    messages (ChangeMessageVisibility 0 does not undo it). The prefix is refused, naming the option and why,
    before any call: three pokes later the other consumer's messages are all in its queue, received by no one,
    and its dead-letter queue is empty."""
    client, ours = sqs_queue
    dead = client.create_queue(QueueName=f"{ours.rsplit('/', 1)[1]}-dlq")["QueueUrl"]
    dead_arn = client.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    theirs = client.create_queue(
        QueueName=f"{ours.rsplit('/', 1)[1]}-other-team",
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": dead_arn, "maxReceiveCount": "2"})},
    )["QueueUrl"]
    bodies = [json.dumps(spot_warning(OTHER)), json.dumps(spot_warning(OURS))]
    for body in bodies:
        client.send_message(QueueUrl=theirs, MessageBody=body)
    monkeypatch.setenv(QUEUES_ENV, ours[: ours.rfind("/") + 1])  # the account prefix
    for _ in range(3):
        with pytest.raises(SpecError, match=r"interruption_queues: .* is an account prefix: list each queue"):
            _sensor(theirs, tmp_path).execute({})
    monkeypatch.setenv(QUEUES_ENV, ours)  # the dedicated queue only: theirs is not on the list
    for _ in range(3):
        with pytest.raises(SpecError, match=r"is not an allowed interruption queue"):
            _sensor(theirs, tmp_path).execute({})
    assert _untouched(client, theirs) == sorted((body, "1") for body in bodies)  # this look is the first
    assert client.receive_message(QueueUrl=dead, WaitTimeSeconds=0).get("Messages", []) == []
