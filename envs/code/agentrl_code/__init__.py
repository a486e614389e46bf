"""agentrl-code: Python programming environments graded by hidden unit tests in a sandbox."""
