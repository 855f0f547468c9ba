"""Producers of timestamped events: NVML, host, annotations, replay."""
