"""Test seams only: nothing here runs unless a test (or a benchmark of faults) asks for it."""
