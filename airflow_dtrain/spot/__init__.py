"""Spot economics: prices, interruption notices, the budget policy and the cost ledger.

Modules, each importable without boto3 or the kubernetes client (they are imported
inside the functions that call AWS or Kubernetes):

- ``pricing``: EC2 spot price history and on-demand prices (Price List API, a built-in
  table, or your own), and the choice of the cheapest acceptable offer.
- ``events``: EventBridge spot interruption warnings and rebalance recommendations as
  they arrive in SQS (raw or in an SNS envelope), and the node taints set by
  aws-node-termination-handler and Karpenter.
- ``members``: where the instance ids / node names of a training group come from.
- ``budget``: the decision spot / on-demand / wait / stop, as pure functions.
- ``ledger``: the cost ledger in the trainer's checkpoint manifests.
"""
