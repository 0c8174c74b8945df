"""Tidelog: a Kafka-compatible event streaming platform."""

__version__ = "0.1.0"
