"""The load test's parts (``benchmarks/load.py``) and the Airflow faults' (``faultlab/airflow_faults.py``): a
real Airflow started component by component (so one can be restarted under a running group), its database
(a throwaway Postgres cluster, else sqlite), the runs it is given, the faults thrown at them and the checks
that nothing crossed between jobs or went missing from a ledger."""
