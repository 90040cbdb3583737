"""Helpers shared by tests (importable as `support.*` via pytest.ini pythonpath)."""
