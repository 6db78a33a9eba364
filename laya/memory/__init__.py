"""The memory planner and what it reads: the GGUF header, the machine, sets of models."""
