"""Simulation building blocks for benchmarks: a virtual-time event loop, latency distributions and
an env whose only behaviour is time. Nothing here is on the training path; benchmarks that use
these parts label their figures as modelled."""
