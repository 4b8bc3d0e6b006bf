"""Tests of the sans-IO MQTT package (broker/mqtt)."""
