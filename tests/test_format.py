"""How numbers read on the dashboard and in the summary line."""

from ddptop.core.format import counted, significant


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
