"""The naive serving baseline for bench/serving.py: Flask calling Keras ``model.predict`` per request.

Typical usage::

    NAIVE_MODEL_DIR=models/cifar10/1 gunicorn --bind 127.0.0.1:8001 "bench.naive_app:create_app()"

What a first attempt usually looks like: gunicorn's default sync worker, one request at a
time, the SavedModel wrapped as a Keras model, Pillow decoding and ``model.predict`` on each
upload, no batching. It answers the same multipart ``POST /api/v1/predict`` as serve/ with the
top label of each image, so one wrk script drives both.
"""

import io
import os

import numpy as np
from flask import Flask, jsonify, request
from PIL import Image


def create_app(model_dir=None):
    """An app around the SavedModel version directory ``model_dir`` (default ``$NAIVE_MODEL_DIR``)."""
    import keras

    from contract import CIFAR10_CLASSES, IMAGE_SIZE, INPUT_PIXELS, OUTPUT_PROBABILITIES, SIGNATURE_PIXELS

    layer = keras.layers.TFSMLayer(model_dir or os.environ["NAIVE_MODEL_DIR"], call_endpoint=SIGNATURE_PIXELS)
    inputs = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3), dtype="uint8", name=INPUT_PIXELS)
    model = keras.Model(inputs, layer(inputs)[OUTPUT_PROBABILITIES])
    app = Flask(__name__)

    @app.post("/api/v1/predict")
    def predict():
        images = []
        for f in request.files.getlist("file"):
            image = Image.open(io.BytesIO(f.read())).convert("RGB").resize((IMAGE_SIZE, IMAGE_SIZE))
            images.append(np.asarray(image))
        probabilities = model.predict(np.stack(images), verbose=0)
        return jsonify(
            predictions=[
                {"label": CIFAR10_CLASSES[int(i)], "probability": float(p.max())}
                for i, p in zip(probabilities.argmax(axis=1), probabilities)
            ]
        )

    return app
