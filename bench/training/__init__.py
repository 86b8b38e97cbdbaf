"""Training: airbench94's own code as the control, time to accuracy, throughput, backends, multi-process JAX."""
