"""Money: one home for what a job's nodes cost, what it has spent, and when it must stop.

May import: ``base``. Standard library only: every training process imports it (the trainer's cap),
and so does the provider at DAG-parse time. Nothing here calls a cloud; a price read from one comes in
through ``prices.PriceSource``.

- ``prices``: price types (``SpotPrice``), the ``PriceSource`` interface every price read implements
  (``airflow_dtrain.aws.prices.AwsPrices``: EC2 and the Price List API; ``StaticPrices``: a fixed table,
  the built-in ``ON_DEMAND_USD_PER_HOUR``), and the reading of a Price List product document.
- ``bill``: dollars for billed seconds, the one place a bill is computed (``dollars_at_prices``), and
  an attempt's spend file billed up to a moment (``billed``) or again at the prices in effect
  (``at_prices_in_effect``).
- ``ledger``: the spend ledger an attempt keeps (``CostLedger``: billed seconds x price x nodes, by
  capacity), the opening of an attempt's spend file (``opening_entry``).
- ``projection``: what the job will have spent when it could next stop (the trainer's cap), and what a
  relaunch needs to reach its next checkpoint (the provider's go-on decision).
- ``cap``: the budget itself (None is no budget), the reserve kept back to stop within
  it (``stop_reserve_s``), and rank 0's enforcement while it trains (``BudgetGuard``).
- ``deadline``: when the platform stops a group at the cap (``budget_deadline``), again from the
  spend while it runs (``repriced_deadline``), and in words (``deadline_words``).

The spend files themselves (where they live, how they are read and summed) are
``trainer.checkpoint.directory``'s, the one reader and writer of a checkpoint directory.
"""
