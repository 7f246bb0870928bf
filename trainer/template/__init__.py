"""Ranks forked from a template that has already imported torch.

Most of a restart is each new rank starting Python and importing torch
(about 2 s a rank on a CPU box, several ranks sharing its cores). The
template does that once per job: torchrun's probe starts it beside torchrun,
it imports torch and ddptop's in-rank code, and then, for every rank torchrun
starts (at launch and at each restart), it forks a child that becomes that
rank and runs the script as `python -u train.py` would.

torchrun stays the engine. Only the last step of its worker start changes:
where it would Popen `python -u train.py ...`, the probe asks the template
(supervisor/launching/template.py) and hands back a Popen-like object over
the forked process. torchrun's rendezvous, environment variables, log files,
restart counting, signals (it signals each rank's process group) and exit
codes are its own, as before.

The template never initialises CUDA and starts no Python thread, so forking
it is what a DataLoader with fork workers already does. A request it cannot
serve exactly (fit.py) is answered "start it plain", and torchrun's own
Popen starts that rank.
"""

MARK = "ddptop.trainer.template"
"""In the template's command line: how the supervisor tells it from torchrun's other children."""
