"""Biplane controller package."""
