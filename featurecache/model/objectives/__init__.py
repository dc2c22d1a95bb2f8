"""What AF3 trains against and reports: the structure losses (SI 4.1-4.2), lDDT, the confidence
targets, losses and metrics (SI 4.3, 5.9), the rigid fit and the truth's permutation alignment.
Pure functions of tensors; they may use the network's gathers and checkpointing, never its
modules' state."""
