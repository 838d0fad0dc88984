"""The stored form: a job's record, state, spec, history, progress and links."""
