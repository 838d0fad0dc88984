"""What an operator sees: log lines, observers, outages, bad rows set aside."""
