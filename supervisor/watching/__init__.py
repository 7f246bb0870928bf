"""The watchdog: rules over the job's records (rules/), and what the policy does about each verdict (core/policy.py)."""
