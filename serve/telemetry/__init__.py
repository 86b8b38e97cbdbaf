"""What the server tells its operators: structured logs with request ids (``logs``), Prometheus metrics (``metrics``)
and OpenTelemetry traces (``tracing``), for HTTP and gRPC alike."""
