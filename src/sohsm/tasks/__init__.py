"""Training tasks beside the language model and the summariser: one folder per task."""
