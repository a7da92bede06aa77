import pytest

from gpusession.configuration.catalog import load_catalog
from gpusession.core.durations import format_duration, parse_duration, parse_money
from gpusession.core.errors import BadInput

REQUIRED = ["t4", "l4", "a10g", "v100", "a100", "a100-80gb", "h100", "h200"]


def test_catalog_has_the_required_types_with_prices_and_instances():
    cat = load_catalog()
    assert set(REQUIRED) <= set(cat.names())
    assert cat.snapshot_date and cat.region
    for name in REQUIRED:
        t = cat.get(name)
        assert t.memory_gb > 0
        assert t.instances and all(i.on_demand > 0 and i.gpu_count >= 1 for i in t.instances)
    assert cat.get("a100").instance_for(8).name == "p4d.24xlarge"
    assert cat.get("h200").instance_for(1).name == "p5en.48xlarge"
    assert cat.get("t4").instance_for(1).name == "g4dn.xlarge"


@pytest.mark.parametrize(
    "text, name, count",
    [("T4", "t4", 1), ("a100:8", "a100", 8), (" H100:1 ", "h100", 1), ("A10", "a10g", 1)],
)
def test_names_are_case_insensitive_and_take_a_count(text, name, count):
    gpu, n = load_catalog().parse(text)
    assert (gpu.name, n) == (name, count)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("t5", "unknown GPU type 't5'"),
        ("t4:x", "bad GPU count"),
        ("t4:0", "at least 1"),
        ("a100:16", "the most is 8"),
    ],
)
def test_bad_types_say_what_is_valid(text, needle):
    with pytest.raises(BadInput) as e:
        load_catalog().parse(text)
    assert needle in str(e.value)
    if "unknown" in needle:
        for name in REQUIRED:
            assert name in str(e.value)


def test_prices_whole_instance_and_per_gpu():
    cat = load_catalog()
    t4 = cat.get("t4")
    assert cat.price_per_hour(t4, 1) == pytest.approx(0.526)
    assert cat.price_per_hour(t4, 1, spot=True, whole_instance=True) == pytest.approx(0.22)
    assert cat.price_per_hour(cat.get("a100"), 8, whole_instance=True) == pytest.approx(21.96)


def test_table_lists_every_type():
    table = load_catalog().table()
    for name in REQUIRED:
        assert f"\n{name} " in table
    assert f"on-demand prices from the catalog of {load_catalog().snapshot_date}" in table


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90s", 90),
        ("15m", 900),
        ("1h30m", 5400),
        ("2h", 7200),
        ("10", 600),
        ("off", None),
        ("0", None),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["abc", "5x", "-3", "1h-2m"])
def test_bad_durations(text):
    with pytest.raises(BadInput) as e:
        parse_duration(text, what="idle timeout")
    assert "idle timeout" in str(e.value)


def test_money_and_format():
    assert parse_money("$5") == 5.0
    with pytest.raises(BadInput):
        parse_money("five")
    assert format_duration(3725) == "1h02m"
