"""The trainer adapters' tests (a package, so its conftest never shadows python/tests/conftest.py as `conftest`)."""
