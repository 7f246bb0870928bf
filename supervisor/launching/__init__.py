"""From the command line to a running torchrun: arguments, plan, the torchrun child and its probe."""
