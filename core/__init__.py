"""What the supervisor, the trainer and the dashboard share.

wire/      the frame format and a schema for every record type
model/     the job model every consumer folds records into: rank and job
           state, rolling statistics, job totals, the table of per-rank metrics
policy.py  the user's policy: what each verdict gets, and the guard's settings a rank is given
launch_env.py  every environment variable the supervisor and the ranks pass each other
format.py  how values read on screen and in logs
rundir.py, eventlog.py   a run's directory and its event log on disk

The trainer imports only wire/, places.py, policy.py and launch_env.py (it is
loaded inside every rank); nothing here imports the supervisor, the trainer
or the dashboard (.importlinter).
"""
