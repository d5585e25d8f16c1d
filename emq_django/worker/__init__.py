"""Job managers: a supervisor process and its worker processes (slots)."""
