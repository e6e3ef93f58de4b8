"""Helpers shared by the test suite: free ports and a real nats-server per test session."""
