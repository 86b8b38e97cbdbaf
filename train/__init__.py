"""Training stage: a registered Keras model on TPU, GPUs, several workers or the CPU."""
