"""A local EC2 for the aws backend's tests, and the network side of its instances.

- `MotoServer`: moto in server mode (`moto_server -H 127.0.0.1 -p PORT`), a real HTTP API.
- `FaultProxy`: an HTTP proxy in front of it. The backend's one seam (GPUSESSION_AWS_ENDPOINT_URL)
  points here; it forwards every call to moto, except calls that match a `Fault`, which get the
  error response AWS would send (InsufficientInstanceCapacity, VcpuLimitExceeded ...; moto
  cannot produce those). Our code parses them with botocore exactly as it would AWS's.
- The AWS Price List API (`pricing` GetProducts), which moto does not have, is played by the
  proxy itself when a test sets `FaultProxy.price_list` (instance type -> on-demand $/h):
  `price_list_reply` answers as AWS does, a PriceList of product JSON documents.
- `inspector(server)`: a boto3 client straight to moto, for tests to *look* (describe_*); no test
  creates with it what the backend is supposed to create.
- `FakePlatform` (support/ec2_platform.py): plays the machine behind each instance;
  fixtures in support/ec2_fixtures.py.
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Callable

from .ports import free_port

REGION = "us-east-1"


def _taken(port: int) -> bool:
    """Whether another process listens on 127.0.0.1:port (a bind there is refused)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


class MotoServer:
    """moto's server with per-zone spot prices a test may set (`set_spot_prices`; moto alone
    prices every zone the same: support/moto_prices.py)."""

    def __init__(self, env: dict[str, str] | None = None):
        import tempfile

        self.prices_file = Path(tempfile.mkdtemp(prefix="moto-prices-")) / "spot.json"
        self.log = open(os.devnull, "wb")
        # a free port is free only until someone binds it: another worker's kernel can take it in
        # the seconds moto's imports take (support/lab.py: a loaded CI run's JupyterLab). A
        # server that could not have its port, or a port that answers not as HTTP, is started
        # again on another, twice at most.
        for _ in range(3):
            if self._start(env):
                return
        self.close()  # its log and prices folder too
        raise RuntimeError(
            "moto_server did not start: three free ports were taken before it bound them"
        )

    def _start(self, env: dict[str, str] | None) -> bool:
        """Started and answering (True); False: its port was taken, the server is stopped."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, str(Path(__file__).with_name("moto_prices.py"))]
        self.proc = subprocess.Popen(
            cmd + ["-H", "127.0.0.1", "-p", str(self.port)],
            env=dict(os.environ, GPUSESSION_TEST_SPOT_PRICES=str(self.prices_file), **(env or {})),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1).read()
                return True
            except OSError:
                if self.proc.poll() is not None and _taken(self.port):
                    return False
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
            except http.client.HTTPException:  # not HTTP: another process's socket there
                self._stop_process()
                return False

    def set_spot_prices(self, prices: dict[str, float]) -> None:
        """The current spot price of zones ("us-east-1c") or zone/instance types
        ("us-east-1c/g4dn.xlarge") until the next reset."""
        self.prices_file.write_text(json.dumps({k: f"{v}" for k, v in prices.items()}))

    def reset(self) -> None:
        self.prices_file.unlink(missing_ok=True)
        urllib.request.urlopen(
            urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=10
        ).read()

    def _stop_process(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def close(self) -> None:
        self._stop_process()
        self.log.close()
        self.prices_file.unlink(missing_ok=True)
        self.prices_file.parent.rmdir()


@dataclasses.dataclass
class Fault:
    """Answer EC2/SSM `action` calls whose parameters contain every `when` item with an error."""

    action: str  # e.g. "RunInstances"
    code: str  # AWS error code
    message: str
    when: dict[str, str] = dataclasses.field(default_factory=dict)  # parameter name -> value
    status: int = 400
    times: int | None = None  # answer this many matching calls, then let them through
    hits: int = 0


def ec2_error(code: str, message: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
        f"<Message>{message}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()


class FaultProxy:
    """Forwards to moto; `faults` (a list the test edits) turn matching calls into AWS errors;
    `calls` records (action, params) of every call, for tests that check what was (not) asked."""

    def __init__(self, upstream: str):
        self.upstream = urllib.parse.urlparse(upstream)
        self.faults: list[Fault] = []
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.price_list: dict[str, float] | None = None  # the Price List API's stand-in
        # action -> its answer (an EC2 XML body, None: moto's), for what moto cannot play
        # (GetConsoleOutput: the console of the machine the test platform runs)
        self.answers: dict[str, Callable[[dict[str, str]], bytes | None]] = {}
        # action -> what to do once moto took it, before the caller hears (the test platform
        # ends a terminated instance's sshd there, as EC2's own machine would stop answering)
        self.after: dict[str, Callable[[dict[str, str]], None]] = {}
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                self._handle()

            def do_POST(self):
                self._handle()

            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                action, params = proxy._action(self.headers, body, self.path)
                if action == "GetProducts" and proxy.price_list is not None:
                    params = {f["Field"]: f["Value"] for f in json.loads(body)["Filters"]}
                    proxy.calls.append((action, params))
                    payload = json.dumps(price_list_reply(params, proxy.price_list)).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-amz-json-1.1")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                proxy.calls.append((action, params))
                answer = proxy.answers.get(action)
                payload = answer(params) if answer else None
                if payload is not None:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                fault = proxy._match(action, params)
                if fault is not None:
                    payload = ec2_error(fault.code, fault.message)
                    self.send_response(fault.status)
                    self.send_header("Content-Type", "text/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(
                    proxy.upstream.hostname, proxy.upstream.port, timeout=60
                )
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
                }
                conn.request(self.command, self.path, body=body, headers=headers)
                reply = conn.getresponse()
                payload = reply.read()
                if reply.status == 200 and action in proxy.after:
                    proxy.after[action](params)
                self.send_response(reply.status)
                for k, v in reply.getheaders():
                    if k.lower() not in (
                        "content-length",
                        "connection",
                        "transfer-encoding",
                        "server",
                        "date",
                    ):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                conn.close()

        # port 0: the system picks one as it binds (no free_port() window for another process)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def _action(headers, body: bytes, path: str) -> tuple[str, dict[str, str]]:
        target = headers.get("X-Amz-Target")  # JSON protocol (SSM): "AmazonSSM.GetParameter"
        if target:
            return target.rsplit(".", 1)[-1], {}
        params = dict(urllib.parse.parse_qsl(body.decode(errors="replace")))
        params.update(urllib.parse.parse_qsl(urllib.parse.urlparse(path).query))
        return params.get("Action", ""), params

    def _match(self, action: str, params: dict[str, str]) -> Fault | None:
        for fault in self.faults:
            if fault.action != action or any(params.get(k) != v for k, v in fault.when.items()):
                continue
            if fault.times is not None and fault.hits >= fault.times:
                continue
            fault.hits += 1
            return fault
        return None

    def actions(self) -> list[str]:
        return [a for a, _ in self.calls]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def price_list_reply(filters: dict[str, str], prices: dict[str, float]) -> dict:
    """A GetProducts answer as the AWS Price List API gives it: one product per matching
    instance type (Linux, shared tenancy), its on-demand hourly price in terms.OnDemand."""
    itype = filters.get("instanceType")
    if itype not in prices or filters.get("operatingSystem") != "Linux":
        return {"FormatVersion": "aws_v1", "PriceList": []}
    sku = f"SKU{abs(hash(itype)) % 10**8:08d}"
    product = {
        "product": {
            "productFamily": "Compute Instance",
            "sku": sku,
            "attributes": {
                "instanceType": itype,
                "regionCode": filters.get("regionCode"),
                "operatingSystem": "Linux",
                "tenancy": filters.get("tenancy"),
            },
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                f"{sku}.JRTCKXETXF": {
                    "offerTermCode": "JRTCKXETXF",
                    "sku": sku,
                    "priceDimensions": {
                        f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "description": f"${prices[itype]} per On Demand Linux {itype}",
                            "pricePerUnit": {"USD": f"{prices[itype]:.10f}"},
                        }
                    },
                }
            }
        },
    }
    return {"FormatVersion": "aws_v1", "PriceList": [json.dumps(product)]}


def inspector(url: str, region: str = REGION):
    """boto3 EC2 client straight to moto: for looking only."""
    import boto3

    return boto3.client(
        "ec2",
        endpoint_url=url,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def leftovers(ec2) -> dict[str, list[str]]:
    """Everything gpusession-tagged that still exists (instances not terminated)."""
    tag = [{"Name": "tag-key", "Values": ["gpusession:session"]}]
    instances = [
        i["InstanceId"] + ":" + i["State"]["Name"]
        for r in ec2.describe_instances(Filters=tag)["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    ]
    return {
        "instances": instances,
        "key_pairs": [k["KeyName"] for k in ec2.describe_key_pairs(Filters=tag)["KeyPairs"]],
        "security_groups": [
            g["GroupId"] for g in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]
        ],
    }


def aws_test_env(monkeypatch, endpoint: str, tmp_path: Path) -> None:
    """Credentials and region for tests, isolated from the user's AWS config."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_EC2",
        "GPUSESSION_AWS_ADDRESS_MAP",
        "GPUSESSION_AWS_AMI",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("GPUSESSION_AWS_ENDPOINT_URL", endpoint)
