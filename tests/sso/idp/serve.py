"""Run the test identity provider: migrate its SQLite file, create the OIDC client and the users named in
``IDP_CLAIMS_FILE`` (password ``IDP_PASSWORD``), then serve on ``IDP_ADDR`` (``127.0.0.1:PORT``) with Django's
threaded development server, no autoreload. The client comes from ``IDP_CLIENT`` (JSON: client_id,
client_secret, redirect_uri, post_logout_redirect_uri)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def main() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.sso.idp.settings"
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from oauth2_provider.models import get_application_model

    call_command("migrate", verbosity=0, interactive=False)
    client = json.loads(os.environ["IDP_CLIENT"])
    get_application_model().objects.create(
        name="ReclaimNet portal", client_id=client["client_id"], client_secret=client["client_secret"],
        client_type="confidential", authorization_grant_type="authorization-code", algorithm="RS256",
        redirect_uris=client["redirect_uri"], post_logout_redirect_uris=client["post_logout_redirect_uri"],
        skip_authorization=True)
    users = get_user_model().objects
    for username, claims in json.loads(Path(os.environ["IDP_CLAIMS_FILE"]).read_text()).items():
        users.create_user(username, email=claims.get("email", f"{username}@campus.test"),
                          password=os.environ["IDP_PASSWORD"])
    call_command("runserver", os.environ["IDP_ADDR"], use_reloader=False, use_threading=True, skip_checks=True)


if __name__ == "__main__":
    main()
