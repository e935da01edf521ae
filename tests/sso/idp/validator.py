"""The test provider's claims: ``email`` and ``preferred_username`` from the account, then whatever the test wrote
for that username in the JSON file ``IDP_CLAIMS_FILE`` (``groups``, ``eduperson_affiliation`` …). The file is
read at every token and userinfo request, so a test changes a person's claims between two sign-ins by rewriting
it, as a campus directory would change."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from oauth2_provider.oauth2_validators import OAuth2Validator


def directory() -> dict[str, dict[str, Any]]:
    return json.loads(Path(os.environ["IDP_CLAIMS_FILE"]).read_text())


class CampusValidator(OAuth2Validator):
    oidc_claim_scope = None  # every claim below goes out (the portal asks for openid email profile)

    def get_additional_claims(self, request: Any) -> dict[str, Any]:
        user = request.user
        return {"email": user.email, "email_verified": True, "preferred_username": user.username,
                **directory().get(user.username, {})}
