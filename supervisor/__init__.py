"""The supervisor: launches a job under torchrun, watches it, serves its records.

Layered, top to bottom (.importlinter checks that no import runs back up):

launch.py     `ddptop launch`: plan the job, fork the dashboard, run the supervisor
supervise.py  one supervised job: the torchrun child, periodic work, verdicts carried out
launching/    from the command line to a running torchrun: arguments, plan, child, probe
cluster/      this supervisor's role in a job of several nodes, and the TCP wire
serving/      records in, logged, folded into the job model, fanned out to dashboards
watching/     the watchdog: rules over the records, and the policy's action on a verdict
sampler.py, heap.py   NVML and psutil readings; the freed heap given back

It never imports the dashboard: `ddptop.cli` hands `launch` the dashboard to open.
"""
