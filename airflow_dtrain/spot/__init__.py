"""Spot economics as pure decisions: offers, interruption notices, the budget policy, the cost ledger.

Nothing here calls AWS or Kubernetes; the I/O lives beside it and hands its readings in:
``airflow_dtrain.aws.prices`` (spot price history, Price List API), ``airflow_dtrain.aws.sqs``
(the interruption queue), ``airflow_dtrain.kubernetes.nodes`` (a group's nodes and their
taints), and ``airflow_dtrain.interruption_watch`` (the watch that looks and acts).

- ``offers``: the built-in on-demand table, Price List product documents, and the choice of
  the cheapest acceptable offer (``choose_offer``, ``price_limit``, ``PriceChoice``).
- ``events``: EventBridge spot interruption warnings and rebalance recommendations as
  they arrive in SQS (raw or in an SNS envelope), and the node taints set by
  aws-node-termination-handler and Karpenter.
- ``interruptions``: what an interruption watch has acted on and when it is over.
- ``members``: where the instance ids / node names of a training group come from (the
  ``InstanceSource`` interface, ``StaticInstances``).
- ``budget``: the decision spot / on-demand / wait / stop, as pure functions.
- ``ledger``: the cost ledger in the trainer's checkpoint manifests (read through
  ``trainer.checkpoint.directory``).
"""
