"""The front end's gRPC server (both gRPC APIs and health) over an app, on a free loopback port, for tests."""

import contextlib


@contextlib.contextmanager
def serving(app, threads=8):
    """``host:port`` of ``app``'s gRPC server while the block runs; stopped after it."""
    from serve.grpc import server as grpc_server

    server, port = grpc_server.make_server(app, "127.0.0.1:0", threads=threads, reuse_port=False)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait()
