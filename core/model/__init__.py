"""The job model: records folded into rank and job state, the same for every consumer."""
