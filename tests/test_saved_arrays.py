"""Arrays of every size survive `stop --save` and `--resume` on every backend that keeps a
workspace: numpy arrays from 1 KB to 100 MB (and 2 GB on the local backend), a dict of arrays
and a pandas DataFrame, made in a real kernel, saved into the workspace by the agent, restored by
a new session's kernel and compared there by their digests.

Real kernels: the local backend's (this Python: numpy and pandas from the `test` extra), the Docker
engine's with gpusession-ci/py-numpy (scripts/ci-images.sh: Debian's python3-numpy and pandas),
the aws backend's on the namespace host of tests/support/ec2_platform.py (moto), same image.
bench/bench_checkpoint.py measures the save's rate; its --sessions mode runs the 2 GB round trip
on every backend."""

from __future__ import annotations

import ast
import os
import textwrap

import pytest

from support.images import image_ready
from support.sinks import Collect

pytest.importorskip("numpy")
pytest_plugins = ["support.ec2_fixtures"]  # fixtures: moto_server, ec2_api, aws_env, look

# integration: starts kernels, the agent or servers (tests/conftest.py: the fast tier starts none)
pytestmark = pytest.mark.integration

NUMPY_IMAGE = "gpusession-ci/py-numpy"

MAKE = """
import hashlib
import numpy as np
def _digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
rng = np.random.default_rng(7)
SIZES = {SIZES}
arrays = {{k: rng.integers(0, 255, n, dtype=np.uint8) for k, n in SIZES.items()}}
for _k, _v in arrays.items():
    globals()[_k] = _v
nested = {{"w": np.arange(250_000.0).reshape(500, 500), "list": [np.zeros(20_000, dtype=np.int32), 3]}}
try:
    import pandas as pd
    frame = pd.DataFrame({{"x": np.arange(100_000), "y": np.linspace(0, 1, 100_000), "s": ["a", "b"] * 50_000}})
except ImportError:
    frame = None
"""

CHECK = """
import hashlib
import numpy as np
def _digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
_out = {k: _digest(globals()[k]) for k in SIZES}
_out["nested"] = _digest(nested["w"]) + _digest(nested["list"][0]) + str(nested["list"][1])
_out["frame"] = None if frame is None else str(pd.util.hash_pandas_object(frame).sum())
print("DIGESTS", repr(_out))
"""

SIZES = {"kb1": 1 << 10, "kb80": 80_000, "mb1": 1 << 20, "mb100": 100 << 20}
BIG = (
    os.environ.get("GPUSESSION_BENCH_BIG_ARRAY") == "1"
)  # bench/bench_checkpoint.py --sessions: + 2 GB everywhere
if BIG:
    SIZES["gb2"] = 2_000_000_000  # 2 GB: under the default cap per variable (2 GiB)
BOUND = "600s" if BIG else "120s"
# on aws the path (workspace volume on the instance, the link) is what is new, not the sizes
AWS_SIZES = SIZES if BIG else {"kb1": 1 << 10, "mb10": 10 << 20}


def _digests(session) -> dict:
    out = Collect()
    assert session.run(CHECK, sink=out)["status"] == "ok", out.text
    (line,) = [line for line in out.text.splitlines() if line.startswith("DIGESTS ")]
    return ast.literal_eval(line.split(" ", 1)[1])


def round_trip(manager, spec_for, sizes: dict, *, bound: str = BOUND) -> None:
    """Make the arrays in a session, `stop --save`, resume on the workspace, compare."""
    first = manager.start(spec_for(name="arr1", workspace="arrays", save_timeout=bound))
    try:
        out = Collect()
        made = first.run(textwrap.dedent(MAKE).format(SIZES=repr(sizes)), sink=out)
        assert made["status"] == "ok", out.text
        before = _digests(first)
    finally:
        stopped = manager.stop(first.id, save=True)
    result = stopped.resource["checkpoint"]
    names = {"arrays", "nested", "frame", "np", "pd", *sizes} - (
        {"pd"} if before["frame"] is None else set()
    )
    assert result["committed"] and not result["skipped"], result
    assert result["saved"] + result["imports"] >= len(names) - 1, result
    again = manager.start(spec_for(name="arr2", resume="arrays", save_timeout=bound))
    try:
        report = again.record.resource["restored"]
        assert not report["failed"] and set(sizes) <= set(report["restored"]), report
        assert _digests(again) == before
    finally:
        manager.stop(again.id)


def test_arrays_round_trip_on_the_local_backend(manager):
    round_trip(
        manager, lambda **o: manager.make_spec("t4", backend="local", idle="off", **o), SIZES
    )


@pytest.mark.slow
@pytest.mark.skipif(
    not BIG, reason="2 GB: bench/bench_checkpoint.py --sessions runs it (CI runs up to 100 MB)"
)
def test_a_2gb_array_round_trips_on_the_local_backend(manager):
    round_trip(
        manager,
        lambda **o: manager.make_spec("t4", backend="local", idle="off", **o),
        {"gb2": 2_000_000_000, "kb1": 1 << 10},
        bound="600s",
    )


@pytest.mark.docker
def test_arrays_round_trip_on_the_docker_engine(manager):
    if not image_ready(NUMPY_IMAGE):
        pytest.skip(f"no Docker engine with {NUMPY_IMAGE} (scripts/ci-images.sh build)")
    round_trip(
        manager,
        lambda **o: manager.make_spec("t4", backend="docker", idle="off", image=NUMPY_IMAGE, **o),
        SIZES,
    )


@pytest.mark.docker
@pytest.mark.slow
def test_arrays_round_trip_on_aws(manager, aws_env, moto_server, tmp_path, monkeypatch):
    from support.ec2_platform import MACHINE_IP, SSH_CIDR, FakePlatform, ensure_ec2_host

    if not image_ready(NUMPY_IMAGE):
        pytest.skip(f"no Docker engine with {NUMPY_IMAGE} (scripts/ci-images.sh build)")
    why = ensure_ec2_host()
    if why:
        pytest.skip(why)
    monkeypatch.setenv("GPUSESSION_AWS_ADDRESS_MAP", f"*={MACHINE_IP}")
    platform = FakePlatform(moto_server.url, tmp_path / "platform")
    try:
        round_trip(
            manager,
            lambda **o: manager.make_spec(
                "t4",
                backend="aws",
                idle="5m",
                image=NUMPY_IMAGE,
                workspace_size="5" if BIG else "1",
                ssh_cidr=SSH_CIDR,
                boot_timeout=120,
                **o,
            ),
            AWS_SIZES,
        )
    finally:
        platform.close()
