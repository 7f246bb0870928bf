"""How numbers read on the dashboard and in the summary line."""

from ddptop.core.format import bandwidth, counted, significant


def test_a_loss_shows_the_same_precision_on_every_row():
    four = significant(4)
    assert [four(v) for v in (2.2, 2.205, 0.012345, 12.3456, 1234.5, 1e-5, None)] == [
        "2.200",
        "2.205",
        "0.01235",
        "12.35",
        "1234",
        "1.000e-05",
        "-",
    ]


def test_a_count_of_one_takes_the_singular():
    assert [counted(n, "alert") for n in (0, 1, 2)] == ["0 alerts", "1 alert", "2 alerts"]


def test_a_bandwidth_reads_in_decimal_units_as_nccl_tests_prints_it():
    assert [bandwidth(v) for v in (None, 512.0, 2.5e3, 104_857_600.0, 12.34e9)] == ["-", "512 B/s", "2.5 kB/s", "104.9 MB/s", "12.3 GB/s"]
