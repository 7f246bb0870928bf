"""This supervisor's place in a job of several nodes, and the wire over TCP."""
