"""A real OpenID Connect provider for the campus sign-in tests: django-oauth-toolkit in a Django process of its
own (tests/sso/idp/serve.py), on loopback, with its own SQLite file."""
