"""A FastAPI order service and a FastAPI sink service on the async API."""
