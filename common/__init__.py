"""Biplane common package."""
