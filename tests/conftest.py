# Top-level pytest conftest, deliberately empty: fixtures live in the conftest.py beside their tests.
