"""The login an instance pulls the session's image with: for an ECR image
(`ACCOUNT.dkr.ecr.REGION.amazonaws.com/...`) a token from `ecr:GetAuthorizationToken` in the
registry's region, asked with the user's AWS identity; for any other registry the user's
`docker login` for it. Obtained at start, before the instance is launched (an identity that may
not pull fails before anything bills), kept in this process's memory only, and handed to the
instance over its SSH login (cloudvm/link.py `send_login`): never in the user data, the store or
a log."""

from __future__ import annotations

import base64
from typing import Callable

from ...transport.pulls import PullLogin, ecr_registry, registry_of, user_login
from .sdk import Aws, aws_errors, explain


def pull_login(image: str, aws_in: Callable[[str], Aws]) -> PullLogin | None:
    """The login for `image`'s registry, or None (a public image, or no `docker login` for it:
    the instance then pulls without one). `aws_in(region)` gives the clients of a region."""
    ecr = ecr_registry(image)
    if ecr is None:
        return user_login(image)
    account, region = ecr
    registry = registry_of(image)
    aws = aws_in(region)
    try:
        data = aws.client("ecr").get_authorization_token(registryIds=[account])
        token = data["authorizationData"][0]["authorizationToken"]
    except aws_errors() as exc:
        raise explain(
            exc, f"getting a login token for the ECR registry {registry}", region
        ) from None
    user, _, password = base64.b64decode(token).decode().partition(":")
    return PullLogin(registry, user, password, source="ECR")
