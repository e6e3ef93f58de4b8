"""Code shared by every process: settings, logging, tracing, errors, gRPC and NATS plumbing."""
