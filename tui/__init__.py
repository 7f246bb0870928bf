"""The dashboard: one Textual app for launch, attach and replay.

It talks to a supervisor only over the wire (source.py): a live socket, or a
finished run's event log, folded into the same job model the supervisor
keeps (ddptop.core.model). It never imports the supervisor.
"""
