"""Pytest fixtures for the real test rig (placeholder; the rig fills this in)."""
