"""Biplane dataplane package."""
