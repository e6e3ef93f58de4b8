"""The public gRPC edge (``AgentService``) for custom harnesses: servicer and its error boundary."""
