"""This project's server against KServe, BentoML and LitServe on the same model and requests: ``python -m bench.peers``."""
