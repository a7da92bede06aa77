"""boto3 for the aws backend: imported lazily, clients made in one place, AWS errors in words.

`Aws(region)` holds one region's EC2 and SSM clients, made from the standard credential chain
(environment, shared config and credentials files with profiles, SSO, instance roles). The only
way tests redirect it is the endpoint seam: env GPUSESSION_AWS_ENDPOINT_URL (a local EC2 API such
as moto's server), which every client of this backend gets as `endpoint_url`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

from ...core.errors import BackendUnavailable, BadInput, GpuSessionError

INSTALL_HINT = "the aws backend needs boto3: pip install 'gpusession[aws]'"
ENDPOINT_ENV = "GPUSESSION_AWS_ENDPOINT_URL"
DEFAULT_REGION = "us-east-1"

# Error codes, grouped by what the user can do about them.
AUTH_CODES = {
    "AuthFailure",
    "UnauthorizedOperation",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
    "UnrecognizedClientException",
    "AccessDenied",
    "AccessDeniedException",
    "OptInRequired",
}
CAPACITY_CODES = {
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientCapacity",
    "SpotMaxPriceTooLow",
    "Unsupported",
    "InsufficientFreeAddressesInSubnet",
}
QUOTA_CODES = {
    "VcpuLimitExceeded",
    "InstanceLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "ResourceLimitExceeded",
}

# Service Quotas codes, so a quota error can say exactly what to ask for.
QUOTA_HINT = (
    "ask for more in the Service Quotas console (EC2: 'Running On-Demand G and VT instances' L-DB2E81BA, "
    "'Running On-Demand P instances' L-417A185B, 'All G and VT Spot Instance Requests' L-3819A6DF, "
    "'All P Spot Instance Requests' L-7212CCBC), or try another --region"
)


def boto3_module():
    """The boto3 package, or BackendUnavailable saying how to install it."""
    try:
        import boto3
    except ImportError:
        raise BackendUnavailable(INSTALL_HINT) from None
    return boto3


def endpoint_url() -> str | None:
    return os.environ.get(ENDPOINT_ENV) or None


class _NoLoginTokens(logging.Filter):
    """botocore logs every response body at DEBUG: an ECR login token (`GetAuthorizationToken`)
    would be in the log of whoever turns DEBUG on. This filter blanks it out of the record."""

    TOKEN = re.compile(r'("authorizationToken"\s*:\s*")[^"]*')
    TOKEN_BYTES = re.compile(rb'("authorizationToken"\s*:\s*")[^"]*')

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self._blank(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: self._blank(v) for k, v in record.args.items()}
        if isinstance(record.msg, (str, bytes)):
            record.msg = self._blank(record.msg)
        return True

    def _blank(self, value):
        if isinstance(value, bytes):
            return self.TOKEN_BYTES.sub(rb"\1(redacted)", value)
        if isinstance(value, str):
            return self.TOKEN.sub(r"\1(redacted)", value)
        return value


_FILTER = _NoLoginTokens()
for _name in ("botocore.parsers", "botocore.endpoint"):
    if _FILTER not in logging.getLogger(_name).filters:
        logging.getLogger(_name).addFilter(_FILTER)


class Aws:
    """One region's clients. Cheap to keep; botocore clients are thread-safe."""

    def __init__(self, region: str | None = None):
        boto3 = boto3_module()
        from botocore.config import Config

        self.session = boto3.session.Session()
        self.region = region or self.session.region_name or DEFAULT_REGION
        self._config = Config(
            region_name=self.region,
            retries={"mode": "standard", "max_attempts": 4},
            connect_timeout=10,
            read_timeout=60,
            user_agent_extra="gpusession",
        )
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()  # a boto3 Session is not thread-safe; its clients are

    def client(self, service: str):
        with self._lock:
            if service not in self._clients:
                self._clients[service] = self.session.client(
                    service, config=self._config, endpoint_url=endpoint_url()
                )
            return self._clients[service]

    @property
    def ec2(self):
        return self.client("ec2")

    @property
    def ssm(self):
        return self.client("ssm")

    def check_region(self) -> None:
        """BadInput for a region botocore has never heard of (before anything is paid for)."""
        known: set[str] = set()
        for partition in self.session.get_available_partitions():
            known.update(self.session.get_available_regions("ec2", partition_name=partition))
        if known and self.region not in known:
            raise BadInput(
                f"unknown AWS region {self.region!r}; valid regions: {', '.join(sorted(known))} "
                "(a region newer than your botocore needs `pip install -U boto3`)"
            )

    def check_credentials(self) -> None:
        """BackendUnavailable when the credential chain finds nothing (nothing is sent yet)."""
        if self.session.get_credentials() is None:
            raise BackendUnavailable(
                "no AWS credentials found: run `aws configure` (keys) or `aws sso login --profile NAME` "
                "and set AWS_PROFILE, or set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
            )


def error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return (response.get("Error") or {}).get("Code")
    return None


def error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        msg = (response.get("Error") or {}).get("Message")
        if msg:
            return str(msg)
    return str(exc)


def explain(exc: BaseException, doing: str, region: str) -> GpuSessionError:
    """An AWS/botocore failure while `doing` something, as an error that says what to do."""
    import botocore.exceptions as bx

    code = error_code(exc)
    text = error_message(exc)
    if isinstance(exc, bx.NoCredentialsError):
        return BackendUnavailable(
            "no AWS credentials found: run `aws configure` or `aws sso login`, or set AWS_PROFILE"
        )
    if isinstance(
        exc, (bx.SSOTokenLoadError, bx.UnauthorizedSSOTokenError, bx.TokenRetrievalError)
    ):
        return BackendUnavailable(f"AWS SSO login expired or missing ({exc}): run `aws sso login`")
    if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError)):
        return BackendUnavailable(f"cannot reach EC2 in {region} while {doing}: {exc}")
    if code == "OptInRequired":
        return BackendUnavailable(
            f"region {region} is not enabled for your account ({text}): enable it or use another --region"
        )
    if code in AUTH_CODES:
        return BackendUnavailable(
            f"AWS refused the credentials while {doing} ({code}: {text}): check `aws sts get-caller-identity`, "
            "your AWS_PROFILE, and that the IAM user or role may use EC2 in this region"
        )
    if code in QUOTA_CODES:
        return GpuSessionError(
            f"{doing}: your AWS quota is too low in {region} ({code}: {text}); {QUOTA_HINT}"
        )
    if code in CAPACITY_CODES:
        return GpuSessionError(f"{doing}: AWS has no capacity right now ({code}: {text})")
    if code:
        return GpuSessionError(f"{doing} failed in {region}: {code}: {text}")
    return GpuSessionError(f"{doing} failed in {region}: {type(exc).__name__}: {exc}")


def aws_errors():
    """The exception classes an AWS call may raise (for `except`)."""
    import botocore.exceptions as bx

    return (bx.BotoCoreError, bx.ClientError)
