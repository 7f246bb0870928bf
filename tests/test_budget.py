from ddptop.trainer.budget import Budget


def runs_out_of(steps: int, step_s: float, cost_s: float) -> int:
    budget, ran = Budget(share=0.005), 0
    for _ in range(steps):
        if budget.due(step_s):
            budget.spent(cost_s)
            ran += 1
    return ran


def test_every_step_when_the_measurement_is_cheap_against_the_step():
    assert runs_out_of(1000, step_s=0.2, cost_s=50e-6) == 1000


def test_sampled_so_that_the_average_cost_stays_within_the_share():
    ran = runs_out_of(10_000, step_s=2e-3, cost_s=100e-6)
    assert 900 <= ran <= 1100  # 0.5% of 2 ms is 10 us a step: one run in ten
    assert ran * 100e-6 <= 0.005 * 10_000 * 2e-3 + 100e-6


def test_a_slow_warm_up_run_is_not_taken_as_the_cost():
    budget = Budget(share=0.005)
    assert budget.due(2e-3)
    budget.spent(5e-3)  # first use: one-time costs, 2.5 steps' worth
    ran = 1
    for _ in range(99):
        if budget.due(2e-3):
            budget.spent(20e-6)
            ran += 1
    assert 40 <= ran <= 60  # the steady 20 us at 10 us of credit a step: every other step
