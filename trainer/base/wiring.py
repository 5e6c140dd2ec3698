"""Every ``DTRAIN_*`` environment variable the trainer and the provider read, listed once, one line each.

Most are **wiring**: what a launcher sets for its own processes (the node agent, the ranks, a program of
your own) to find their group, job and files. None of them is a setting a user chooses: a setting is a
declared field (``trainer.config.fields.setting``), with its default, help and bounds. The deployment's
own directories are ``ENVIRONMENT``; ``TEST_SEAMS`` exist only for the tests and the fault benchmarks.
The group's settings that its agents read (``JobSpec.keep_workers``, ...) reach them as wiring too: the
launcher sets one where the field is not its default. tests/unit/test_architecture.py compares these
tables with every ``DTRAIN_*`` name the code spells.
"""

WIRING = {
    "DTRAIN_AGENT_PID": "the node agent's pid, which its workers and their hosts watch",
    "DTRAIN_CAPACITY_FILE": "a local elastic group's capacity: how many nodes the platform runs now",
    "DTRAIN_CHECKPOINT_EVERY": "the job's checkpoint interval, for a program of your own (trainer.contract)",
    "DTRAIN_CHECKPOINT_URI": "the job's checkpoint directory, for a program of your own",
    "DTRAIN_EVENTS_DIR": "where each rank appends its events (trainer.events)",
    "DTRAIN_FORK_WORKERS": "0: JobSpec.fork_workers=False, each worker a new interpreter",
    "DTRAIN_GRACE_PERIOD_S": "the seconds a rank has to save after SIGTERM",
    "DTRAIN_GROUP_NAME": "the local group a process belongs to (found again by the launcher)",
    "DTRAIN_JOB": "the job's name",
    "DTRAIN_KEEP_WORKERS": "0: JobSpec.keep_workers=False, new training processes at a resize",
    "DTRAIN_LAUNCHED_AT": "when the attempt was launched, where its billing starts (trainer.money.ledger)",
    "DTRAIN_LOCAL_GROUP_DIR": "a local group's state directory",
    "DTRAIN_NODE_RANK": "a pod's node rank (Kubernetes: its completion index)",
    "DTRAIN_NODE_STOPPED_FILE": "a node stopped for good: a restart exits at once with its code",
    "DTRAIN_OWNER": "the job's owner, recorded in its manifests",
    "DTRAIN_RDZV_POLL_S": "JobSpec.resize_poll_s, where not 0.1: seconds between two polls of a resize round",
    "DTRAIN_REQUESTS_FILE": "a pod's annotations, where checkpoint-now requests arrive",
    "DTRAIN_SIMULATE_PREEMPTION_AT_STEP": "the step at which the demo's preemption is simulated",
    "DTRAIN_STARTED_AT": "when a kept process's round started (trainer.elastic.startup)",
    "DTRAIN_STATSD_HOST": "where the ranks send statsd (the provider's [dtrain] statsd_host, or the node)",
    "DTRAIN_STATSD_PORT": "its port",
    "DTRAIN_STATSD_TAGS": "the task instance's and job's tags on every metric",
    "DTRAIN_STEPS": "the job's target steps, for a program of your own",
    "DTRAIN_WARM_BEFORE_JOIN": "0: JobSpec.warm_before_join=False, a joining node joins before it compiles",
    "DTRAIN_WORKER_HOSTS": "the directory of a node's kept training processes' sockets",
    "DTRAIN_WORLD": "the rendezvous round a world's keys carry (trainer.elastic.rdzv_round)",
}
ENVIRONMENT = {
    "DTRAIN_DATA_DIR": "where a node keeps the built-in corpus and prepared data it downloaded",
    "DTRAIN_LOCAL_STATE_DIR": "the local backend's state directory (over [dtrain] local_state_dir)",
    "DTRAIN_PREPARED_DATA_ROOT": "where the bundled DAGs' prepare_data task writes token stores",
    "DTRAIN_STAGING_DIR": "where an async save stages its files on local disk",
    "DTRAIN_TORCH_PRIVATE_OFF": "private torch hooks to run without (trainer.torch_private: all, or names)",
    "DTRAIN_TRACE_SAMPLES": "a file each rank appends its samples' ids to (the data-order tests)",
}
TEST_SEAMS = {
    "DTRAIN_FAULTS": "the fault injector a test activates (trainer.testing.faults)",
    "DTRAIN_TEST_COMMIT_DELAY": "seconds a commit waits (a slow store)",
    "DTRAIN_TEST_ENOSPC_AT_STEP": "a full disk at a step's save",
    "DTRAIN_TEST_HOLD": "a rank that hangs (a hung-rank trial)",
    "DTRAIN_TEST_SLOW_FSYNC": "seconds each fsync takes",
    "DTRAIN_TEST_STEP_SLEEP": "seconds each step also sleeps (a slower machine)",
}
