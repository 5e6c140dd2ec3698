"""A stateful fake Kubernetes API server on 127.0.0.1, for tests (there is no cluster here).

The real kubernetes client talks to it over HTTP, through a kubeconfig that points at
it, exactly as it would to a cluster. It keeps namespaces, ConfigMaps, Services, Pods
and batch/v1 Jobs, answers list calls with label selectors, serves pod logs (with
``timestamps``, ``sinceSeconds`` and ``tailLines``), applies JSON merge patches, and
deletes with the propagation policies of the real garbage collector (Jobs default to
orphaning, as ``batch/v1`` does).

It also plays a small Job controller: an Indexed Job gets one Pod per completion index;
tests then drive the pods (``run``, ``log``, ``exit``, ``disrupt``, ``unschedulable``) and
the nodes they run on (``add_node``, ``taint``)
and the fake applies the Job's ``podFailurePolicy`` rules, completion, suspension and
replacement pods the way the real controller does for the fields the launcher uses, including an elastic
group's per-index ones (``backoffLimitPerIndex`` with its failure backoff before a replacement,
``maxFailedIndexes``, ``FailIndex``, ``successPolicy``); it refuses (422) the combinations of those fields
that a real API server refuses.

It acts on its own, as a cluster does with nobody calling it (a thread, and before every
request): a Job past its ``activeDeadlineSeconds`` since its ``startTime`` fails with reason
``DeadlineExceeded`` and its running pods are deleted, and a finished Job past its
``ttlSecondsAfterFinished`` is deleted with its dependents (the TTL controller's foreground
deletion). ``advance(seconds)`` moves the fake's clock forward for both. Its scheduler check:
``run(nodes=...)`` refuses a node that the pod's nodeSelector or required node affinity excludes.

``pods/exec`` speaks the real protocol (a WebSocket upgrade, then ``v4.channel.k8s.io``
frames: stdout on channel 1, stderr on 2, the exit status on 3). Nothing is executed: the
test's ``exec_handler(namespace, pod, container, command) -> (stdout, stderr, exit_code)``
answers, and every exec is recorded in ``execs``.

A busy or failing API server is played with ``fail_next(method, path, code)``: the next
matching requests are answered with that status (and ``Retry-After``, if given) before the
fake looks at them.

Its parts: ``wire`` (routes, selectors, merge patches, the error), ``store`` (the API's verbs),
``controller`` (the Job, deadline and TTL controllers), ``driver`` (what tests drive), ``exec``
(``pods/exec``) and ``server`` (the HTTP server that puts them together).
"""

from tests.kubernetes.fakeapi.server import FakeKubernetesApiServer
from tests.kubernetes.fakeapi.wire import ApiError, matches, merge_patch, scheduling_problem

__all__ = ["ApiError", "FakeKubernetesApiServer", "matches", "merge_patch", "scheduling_problem"]
