"""How numbers read on the dashboard and in the summary line."""

from ddptop.core.format import significant


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
