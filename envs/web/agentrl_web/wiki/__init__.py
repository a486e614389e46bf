"""The knowledge site: a generated small world, its articles, tasks, and the Starlette app."""
