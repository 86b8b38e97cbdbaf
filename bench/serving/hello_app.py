"""The floor for bench/serving/speed.py and bench/peers: a hello-world Flask app under serve/'s own gunicorn layout.

Typical usage::

    gunicorn -c python:serve.gunicorn_conf "bench.serving.hello_app:create_app()"

It answers ``POST /api/v1/predict`` by reading the body and returning a fixed JSON answer: no
multipart parsing, no decoding, no model. What it reaches is what Flask and gunicorn cost on
this machine, the most any server of this layout can answer; serve/ is measured against it.
"""

from flask import Flask, jsonify, request


def create_app():
    app = Flask(__name__)

    @app.post("/api/v1/predict")
    def predict():
        request.get_data()  # read the upload, as any server must
        return jsonify(predictions=[{"label": "airplane", "class_id": 0, "probability": 1.0}])

    return app
