"""Export stage: a training run's weights to a versioned SavedModel for TF Serving."""
