"""Sensors of airflow-dtrain: a module each (the package imports none of them)."""
