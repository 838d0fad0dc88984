"""The two drivers of the engine: the in-process Worker and Dramatiq's middleware."""
