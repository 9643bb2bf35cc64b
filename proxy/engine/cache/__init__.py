"""The inference cache (a pipeline's whole answer) and the data cache (a step's outputs):
keys (keys.py), entries (entries.py), stores in process or in Redis (stores.py), and the
lookup beside the run with single flight (answers.py)."""
