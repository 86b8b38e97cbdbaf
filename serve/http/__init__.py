"""What HTTP needs around the protocols: readable bodies (``bodies``, ``json_tensors``), the core's gate as hooks with
the security headers, CORS and proxies (``security``), one way to answer every error (``errors``), and the probes
and the metrics scrape (``health``). The protocols' own routes are in :mod:`serve.protocols`."""
