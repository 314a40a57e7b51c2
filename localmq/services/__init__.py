"""Background services (Python threads): dispatch, flush, allocation, cleanup."""
