"""The supervisor's serving half: records in, logged, folded into the job model, fanned out."""
