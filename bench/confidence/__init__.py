"""Honest confidence: calibration, out-of-distribution images and common corruptions, on what the server answers."""
