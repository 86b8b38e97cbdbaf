"""The command-line client: classifies images over HTTP or gRPC, never importing TensorFlow."""
