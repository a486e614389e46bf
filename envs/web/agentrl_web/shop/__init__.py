"""The shop app: a generated catalogue, its tasks and reward, and the Starlette app serving it."""
