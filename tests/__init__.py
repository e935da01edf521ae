"""Test suite (a package so that tests/portal/ does not shadow the real ``portal`` package)."""
