"""A pool of boxes (issue 34 §2) on data: which GPUs are of the type asked, the box with the most
free ones, the lines that say which and why, the pools setting and --host pool:NAME; a box that
does not answer is skipped by the deadline, never waited for. Real boxes (the namespace hosts):
tests/test_docker_placement.py."""

from __future__ import annotations

import threading
import time

import pytest

from gpusession.backends.docker import pools
from gpusession.backends.docker.gpus import BoxGpu
from gpusession.core.errors import BadInput
from gpusession.core.textvalues import host_or_pool
from gpusession.core.textvalues import pools as read_pools


def gpu(index, name="NVIDIA A100-SXM4-80GB", util=0.0):
    return BoxGpu(index, f"GPU-{index}", name, 0, 80 << 30, util, 0)


@pytest.mark.parametrize(
    "name, gpu_type, matches",
    [
        ("NVIDIA A100-SXM4-80GB", "a100", True),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb", True),
        ("NVIDIA A100-PCIE-40GB", "a100-80gb", False),
        ("Tesla T4", "t4", True),
        ("NVIDIA L40S", "l4", False),
        ("NVIDIA L4", "l4", True),
        (None, "t4", False),
    ],
)
def test_a_gpu_is_of_a_type_when_every_part_of_the_type_is_a_word_of_its_name(
    name, gpu_type, matches
):
    assert pools.type_matches(name, gpu_type) is matches


def test_the_box_with_the_most_free_gpus_is_chosen_and_the_line_says_why():
    answers = [
        pools.BoxAnswer("ssh://gpu1", free=[gpu(0)], gpus=8),
        pools.BoxAnswer("ssh://gpu2", free=[gpu(i) for i in range(5)], gpus=8),
        pools.BoxAnswer("ssh://gpu3", skipped="no answer within 20s"),
    ]
    chosen = pools.best_box(answers, 1)
    assert chosen.host == "ssh://gpu2"
    assert pools.chosen_line("lab", chosen, answers, "a100") == (
        "pool lab: ssh://gpu2, the most free a100 (5 of 8) "
        "(ssh://gpu1: 1 free; ssh://gpu3: skipped, no answer within 20s)"
    )
    assert pools.best_box(answers, 6) is None
    line = pools.full_line("lab", answers, "a100", 6)
    assert line.startswith("no box of pool lab has 6 free a100 (ssh://gpu1: 1 of 8 free;")
    assert "\n" not in line and "--type a,b" in line


def test_a_box_that_does_not_answer_is_skipped_by_the_deadline():
    stuck = threading.Event()

    def client_for(host):
        if host == "ssh://stuck":
            stuck.wait(30)  # a login that hangs
        raise ConnectionRefusedError(f"[Errno 111] Connection refused: {host}")

    began = time.monotonic()
    answers = pools.ask_pool(client_for, ["ssh://stuck", "ssh://down"], "a100", timeout=1.0)
    stuck.set()
    assert time.monotonic() - began < 5
    assert answers[0].skipped == "no answer within 1s"
    assert answers[1].skipped == "[Errno 111] Connection refused: ssh://down"


def test_pools_are_a_json_object_of_ssh_addresses():
    assert read_pools('{"lab": ["ssh://gpu1", "ssh://me@gpu2:2222/"]}') == {
        "lab": ["ssh://gpu1", "ssh://me@gpu2:2222"]
    }
    assert read_pools("") == {}
    for bad in ('["ssh://gpu1"]', '{"lab": []}', '{"lab": ["gpu1"]}', "{lab"):
        with pytest.raises(BadInput):
            read_pools(bad)
    assert host_or_pool(" pool:lab ") == "pool:lab"
    with pytest.raises(BadInput, match="pool name"):
        host_or_pool("pool:")


def test_an_unknown_pool_is_refused_naming_the_configured_ones(monkeypatch, gs_home):
    from gpusession.session import SessionManager

    monkeypatch.setenv("GPUSESSION_DOCKER_POOLS", '{"lab": ["ssh://gpu1"]}')
    m = SessionManager()
    try:
        with pytest.raises(BadInput) as err:
            m.create(m.make_spec("a100", backend="docker", host="pool:farm"))
        assert "no pool 'farm' (pools: lab)" in str(err.value)
        assert m.list() == []
    finally:
        m.close()


async def test_the_forms_offer_the_configured_pools_for_the_host(gs_home, jp_fetch, monkeypatch):
    """GET options' `places`: per backend, what its --host field offers (the sidebar's datalist,
    the widget form's combobox); the docker pools as `pool:NAME`, nothing for a bad setting."""
    import json

    from gpusession.configuration.config import EnvConfig
    from gpusession.configuration.registry import backend_places

    monkeypatch.setenv("GPUSESSION_DOCKER_POOLS", '{"lab": ["ssh://gpu1"], "big": ["ssh://gpu2"]}')
    r = await jp_fetch("gpusession", "api", "options")
    assert json.loads(r.body)["places"] == {"docker": ["pool:big", "pool:lab"]}
    monkeypatch.setenv("GPUSESSION_DOCKER_POOLS", "{not json")
    assert backend_places(EnvConfig()) == {}


def test_an_administrators_policy_names_pools_every_user_gets(gs_home, tmp_path, monkeypatch):
    """A policy's `pools` (issue 34 §2) come with the user's own (DockerBackend.pools), its
    pool of a name the user also has wins; the forms offer them; a bad one is one line naming
    the file."""
    import json

    from gpusession.backends.docker import DockerBackend
    from gpusession.configuration.config import EnvConfig
    from gpusession.configuration.registry import backend_places
    from gpusession.configuration.settings import ConfigError, load_policy

    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"pools": {"lab": ["ssh://gpu1", "ssh://gpu2"]}}))
    monkeypatch.setenv("GPUSESSION_POLICY", str(policy))
    monkeypatch.setenv("GPUSESSION_DOCKER_POOLS", '{"lab": ["ssh://mine"], "own": ["ssh://x"]}')
    assert DockerBackend.all_pools(EnvConfig()) == {
        "lab": ["ssh://gpu1", "ssh://gpu2"],
        "own": ["ssh://x"],
    }
    assert backend_places(EnvConfig()) == {"docker": ["pool:lab", "pool:own"]}
    policy.write_text(json.dumps({"pools": {"lab": ["http://gpu1"]}}))
    with pytest.raises(ConfigError, match=f"the gpusession policy {policy} cannot be used"):
        load_policy()
    assert backend_places(EnvConfig()) == {}  # the forms offer nothing; a start says why
