"""The asyncio broker process: a thin driver around the replica cores (DESIGN.md §3)."""
