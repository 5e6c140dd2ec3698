"""The bottom layer: where files live, locally or on s3:// (``storage``), lines to stderr in one write
(``say``), the statsd wire format (``statsd``) and every ``DTRAIN_*`` variable read, listed once
(``wiring``).

May import: no other part of the trainer. Standard library (and fsspec, for s3://) only.
"""
