"""MQTT (draft)."""
