"""AWS I/O of the spot features, every call through the amazon provider's hooks.

- ``prices``: EC2 spot price history and on-demand prices (Price List API), and one look at
  the market (``find_offer``), whose choice is ``airflow_dtrain.spot.offers``'s.
- ``sqs``: receiving the interruption notices of a group from an EventBridge-fed SQS queue,
  releasing the others, deleting those acted on.

Importing these modules imports no boto3: the hooks are imported inside the functions that
call AWS.
"""
