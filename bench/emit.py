"""How a bench script hands back its report: printed as JSON, and written to ``--json`` when given."""

import json


def emit(report, path=None):
    """Print ``report`` as indented JSON; also write it to ``path`` unless that is None."""
    text = json.dumps(report, indent=1)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
