"""Capacity reports over controller snapshot files (PySpark)."""
