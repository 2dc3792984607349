"""The asyncio broker process: a thin driver around the replica cores (docs/design.md#driver-contracts)."""
