import pytest

from gpusession.backends.aws import AwsBackend
from gpusession.backends.aws.instances import packaged_table
from gpusession.configuration.catalog import load_catalog
from gpusession.core.durations import format_duration, parse_duration, parse_money
from gpusession.core.errors import BadInput

REQUIRED = ["t4", "l4", "a10g", "v100", "a100", "a100-80gb", "h100", "h200"]


def test_catalog_says_what_each_type_is_and_one_reference_rate_with_its_source():
    cat = load_catalog()
    assert set(REQUIRED) <= set(cat.names())
    assert cat.snapshot_date and cat.region
    assert cat.source.startswith("AWS on-demand, us-east-1, per GPU")
    for name in REQUIRED:
        t = cat.get(name)
        assert t.memory_gb > 0 and t.rate > 0 and t.fp16_tflops
        assert not hasattr(t, "instances")  # how a cloud sells it is its backend's


def test_the_reference_rates_are_the_aws_tables_per_gpu_prices_of_the_same_date():
    """The catalog's rate of a type is one GPU's share of the smallest EC2 instance that carries
    it, in the aws backend's own table (backends/aws/instances.json) of the same date."""
    cat, table = load_catalog(), packaged_table()
    assert table.snapshot_date == cat.snapshot_date and table.region == cat.region
    for gpu in cat.whole_types():
        assert gpu.rate == pytest.approx(table.per_gpu(gpu)), gpu.name
    assert table.instance_for(cat.get("a100"), 8).name == "p4d.24xlarge"
    assert table.instance_for(cat.get("h200"), 1).name == "p5en.48xlarge"
    assert table.instance_for(cat.get("t4"), 1).name == "g4dn.xlarge"
    with pytest.raises(BadInput, match="the most is 8"):
        table.instance_for(cat.get("a100"), 16)


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
        ("a100-1g.10gb:8", "at most 7 x a100-1g.10gb"),
    ],
)
def test_bad_types_say_what_is_valid(text, needle):
    with pytest.raises(BadInput) as e:
        load_catalog().parse(text)
    assert needle in str(e.value)
    if "unknown" in needle:
        for name in REQUIRED:
            assert name in str(e.value)


def test_prices_per_gpu_here_and_whole_instances_in_the_aws_table():
    cat, table = load_catalog(), packaged_table()
    t4 = cat.get("t4")
    assert cat.price_per_hour(t4, 1) == pytest.approx(0.526)
    assert cat.price_per_hour(cat.get("a100"), 2) == pytest.approx(2 * 21.96 / 8)
    assert table.price(t4, 1, spot=True) == pytest.approx(0.22)
    assert table.price(cat.get("a100"), 8) == pytest.approx(21.96)
    # what the aws backend weighs types by (advice, --cheapest): per GPU of the smallest
    # instance, spot when asked; None where no instance carries them
    assert AwsBackend.gpu_rate(cat, t4, 4, spot=True) == pytest.approx(0.88)
    assert AwsBackend.gpu_rate(cat, cat.get("a100-1g.10gb"), 1) is None
    assert AwsBackend.gpu_rate(cat, t4, 9) is None


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
