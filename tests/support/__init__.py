"""Test-side helpers shared by every test area (importable as `support`: pytest pythonpath)."""
