"""Serving: speed of the runtimes, the request path's parts, protocols, slow clients and soaks."""
