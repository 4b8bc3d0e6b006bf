"""A trio client of NATS and JetStream."""
