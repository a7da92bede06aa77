"""Fallback lists of GPU types (issue 34 §3) on data: what --type l4,a10g,t4 and --gpu-mem 24G
make of a start on every face, the order tried (--cheapest: by price), the next type after one
with no capacity, and the words every face shows of the type taken. On aws (moto):
tests/test_aws_provision.py; on a pool of docker boxes: tests/test_docker_placement.py."""

from __future__ import annotations

import pytest

from gpusession.configuration import options
from gpusession.configuration.catalog import load_catalog
from gpusession.configuration.config import GpuSessionConfig
from gpusession.session.fallback import moved_on, next_type, taken_line
from gpusession.words.status import placement_line


def spec(face=options.REST, **values):
    return options.build_spec(
        values,
        config=GpuSessionConfig(),
        catalog=load_catalog(),
        backend_default="docker",
        face=face,
    )


def test_a_type_list_is_tried_in_the_order_written():
    s = spec(type="l4,a10g:2, t4")
    assert (s.gpu_type, s.gpu_count) == ("l4", 1)
    assert s.extra["types"] == ["l4:1", "a10g:2", "t4:1"]
    assert "types" not in spec(type="l4").extra  # one type: no list


def test_cheapest_orders_the_list_by_spot_price():
    s = spec(type="a10g,l4,t4", backend="aws", cheapest=True)
    assert s.extra["types"] == ["t4:1", "l4:1", "a10g:1"]


def test_gpu_mem_admits_every_type_with_that_much_cheapest_first():
    s = spec(gpu_mem="24G")
    assert s.extra["types"][:2] == ["l4:1", "a10g:1"] and "t4:1" not in s.extra["types"]
    assert s.extra["gpu_mem"] == 24
    # with a list: the ones of it with that much, in its order
    assert spec(type="t4,a10g,l4", gpu_mem="24GiB").extra["types"] == ["a10g:1", "l4:1"]


@pytest.mark.parametrize(
    "values, field, needle",
    [
        ({"type": "t4,v100", "gpu_mem": "24G"}, "--gpu-mem", "no GPU type of --type has 24 GiB"),
        ({"gpu_mem": "lots"}, "--gpu-mem", "bad GPU memory 'lots'"),
        ({"type": "l4,nope"}, "--type", "unknown GPU type 'nope'"),
    ],
)
def test_a_list_nothing_can_satisfy_is_refused_naming_the_option(values, field, needle):
    with pytest.raises(options.BadOptions) as err:
        spec(face=options.FLAGS, **values)
    assert field in str(err.value) and needle in str(err.value)


def test_the_next_type_after_one_without_capacity():
    s = spec(type="l4,a10g,t4")
    assert next_type(s) == ("a10g", 1)
    s2 = moved_on(s, ("a10g", 1), "no g6.xlarge could be launched in us-east-1")
    assert (s2.gpu_type, next_type(s2)) == ("a10g", ("t4", 1))
    assert s2.extra["passed_over"] == [
        {"type": "l4:1", "why": "no g6.xlarge could be launched in us-east-1"}
    ]
    assert next_type(moved_on(s2, ("t4", 1), "full")) is None
    assert next_type(spec(type="t4")) is None
    assert taken_line(s2) == (
        "took a10g:1 of l4:1, a10g:1, t4:1 (passed over l4:1: no g6.xlarge could be launched in us-east-1)"
    )


def test_every_face_says_the_type_taken_and_the_gpus_held():
    view = {
        "gpu_type": "a10g",
        "gpu_count": 1,
        "types": ["l4:1", "a10g:1"],
        "passed_over": [{"type": "l4:1", "why": "no free GPU on ssh://gpu1"}],
        "gpu_indices": [4],
        "host": "ssh://gpu2",
    }
    assert placement_line(view) == (
        "took a10g:1 of l4:1, a10g:1 (passed over l4:1: no free GPU on ssh://gpu1); "
        "holds GPU 4 of ssh://gpu2"
    )
    assert placement_line({"gpu_type": "t4", "gpu_count": 1}) is None


def test_the_widget_card_says_how_a_session_was_placed():
    from gpusession.core.models import Event, LaunchSpec, SessionRecord, State
    from gpusession.session.views import session_view
    from gpusession.widgets.card import SessionCard

    spec = LaunchSpec(
        gpu_type="a100",
        backend="docker",
        extra={
            "host": "ssh://gpu2",
            "types": ["h100:1", "a100:1"],
            "passed_over": [{"type": "h100:1", "why": "no box of pool lab has 1 free h100"}],
            "pool_choice": "pool lab: ssh://gpu2, the most free a100 (8 of 8)",
        },
    )
    record = SessionRecord(
        id="abc",
        name="p",
        spec=spec,
        state=State.RUNNING,
        created_at=1.0,
        updated_at=1.1,
        owner="me",
        price_per_hour=2.7,
        events=[Event("abc", State.RUNNING, 1.0)],
        resource={"gpu_indices": [3]},
    )
    card = SessionCard(session_view(record), on_stop=print, on_keepalive=print)
    assert (
        "took a100:1 of h100:1, a100:1 (passed over h100:1: no box of pool lab"
        in card.placement.value
    )
    assert "pool lab: ssh://gpu2, the most free a100" in card.placement.value
    assert "holds GPU 3 of ssh://gpu2" in card.placement.value
