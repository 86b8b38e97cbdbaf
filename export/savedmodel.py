"""The SavedModel export writes: its two serving signatures, TF Serving's warmup records, and a
``saved_model_cli``-like reading of the signatures it holds."""

import os

from contract import (CHANNELS, IMAGE_SIZE, INPUT_BYTES, INPUT_PIXELS, OUTPUT_CLASS_IDS, OUTPUT_CLASS_NAMES,
                      OUTPUT_IN_DISTRIBUTION, OUTPUT_OOD_SCORE, OUTPUT_PROBABILITIES, RESIZE_METHOD, SIGNATURE_BYTES,
                      SIGNATURE_PIXELS)

#: The name scope of the operators after the logits (temperature, softmax, score, threshold): the
#: graph and its LiteRT models name them so.
CONFIDENCE_SCOPE = "confidence"

WARMUP_BATCH_SIZES = (1, 8)  # one record per signature and batch size


def save(logits_model, class_names, path, temperature=1.0, threshold=None):
    """Write the model with both serving signatures through Keras's ExportArchive.

    ``logits_model`` (train.models.logits_model) gives the logits; the graph adds what
    contract.confidence defines: ``probabilities = softmax(logits / temperature)``, ``ood_score``
    (the energy of the logits) and, when ``threshold`` is given, ``in_distribution``.
    """
    import keras
    import tensorflow as tf

    names = tf.constant(list(class_names), dtype=tf.string)

    def predict(pixels):
        # Cast, not normalise: scaling is the model's own first layer.
        logits = tf.cast(logits_model(tf.cast(pixels, tf.float32), training=False), tf.float32)
        with tf.name_scope(CONFIDENCE_SCOPE):
            probabilities = tf.nn.softmax(logits / temperature, axis=-1)
            ood_score = -tf.reduce_logsumexp(logits, axis=-1)
            outputs = {OUTPUT_PROBABILITIES: probabilities, OUTPUT_OOD_SCORE: ood_score}
            if threshold is not None:
                outputs[OUTPUT_IN_DISTRIBUTION] = ood_score <= threshold
        # The class is the logits' argmax, which a temperature cannot change.
        class_ids = tf.argmax(logits, axis=-1, output_type=tf.int64)
        outputs.update({OUTPUT_CLASS_IDS: class_ids, OUTPUT_CLASS_NAMES: tf.gather(names, class_ids)})
        return outputs

    # Argument names are the signature's input keys; TensorSpec names say the same.
    def serve_pixels(images):
        return predict(images)

    def serve_bytes(image_bytes):
        pixels = tf.map_fn(_decode, image_bytes, fn_output_signature=tf.TensorSpec(
            [IMAGE_SIZE, IMAGE_SIZE, CHANNELS], tf.uint8))
        return predict(pixels)

    archive = keras.export.ExportArchive()
    archive.track(logits_model)
    archive.add_endpoint(SIGNATURE_PIXELS, serve_pixels, input_signature=[
        tf.TensorSpec([None, IMAGE_SIZE, IMAGE_SIZE, CHANNELS], tf.uint8, name=INPUT_PIXELS)])
    archive.add_endpoint(SIGNATURE_BYTES, serve_bytes, input_signature=[
        tf.TensorSpec([None], tf.string, name=INPUT_BYTES)])
    archive.write_out(path, verbose=False)


def _decode(data):
    """One encoded image to uint8 RGB 32x32, as the server's Pillow path would give it."""
    import tensorflow as tf

    # expand_animations=False: a GIF gives its first frame, [H, W, 3] like the others;
    # channels=3 turns grayscale and RGBA into RGB.
    image = tf.io.decode_image(data, channels=CHANNELS, expand_animations=False, dtype=tf.uint8)
    shape = tf.shape(image)
    same_size = tf.logical_and(tf.equal(shape[0], IMAGE_SIZE), tf.equal(shape[1], IMAGE_SIZE))

    def resize():
        resized = tf.image.resize(image, [IMAGE_SIZE, IMAGE_SIZE], method=RESIZE_METHOD, antialias=True)
        # Back to whole 0-255 pixels, as Pillow returns them, so both resize paths feed the
        # model the same kind of input.
        return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)

    # Skipping the resize for 32x32 images makes this path bit-identical to serving_default.
    image = tf.cond(same_size, lambda: image, resize)
    return tf.ensure_shape(image, [IMAGE_SIZE, IMAGE_SIZE, CHANNELS])


def read_signatures(path):
    """The serving signatures in ``path/saved_model.pb``, as TF Serving sees them.

    Returns ``{signature: {"inputs": {key: (dtype, shape)}, "outputs": {...}}}`` where
    dtype is a name such as ``"uint8"`` and shape a list with -1 for unknown sizes.
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    signature_defs = saved_model.meta_graphs[0].signature_def

    def describe(tensors):
        return {
            key: (tf.dtypes.as_dtype(info.dtype).name,
                  [-1 if info.tensor_shape.unknown_rank else d.size for d in info.tensor_shape.dim])
            for key, info in sorted(tensors.items())
        }

    return {
        name: {"inputs": describe(sig.inputs), "outputs": describe(sig.outputs)}
        for name, sig in sorted(signature_defs.items())
        if not name.startswith("__")  # TF's internal __saved_model_init_op
    }


def format_signatures(signatures):
    """A ``saved_model_cli show``-like listing of :func:`read_signatures`' result."""
    lines = []
    for name, sig in signatures.items():
        lines.append(f"signature_def[{name!r}]:")
        for kind in ("inputs", "outputs"):
            lines.append(f"  {kind}:")
            for key, (dtype, shape) in sig[kind].items():
                lines.append(f"    {key}: {dtype} {_shape_text(shape)}")
    return "\n".join(lines)


def _shape_text(shape):
    return "[" + ", ".join("None" if d == -1 else str(d) for d in shape) + "]"


def write_warmup(path, name, images):
    """PredictionLog records for both signatures on the first of ``images``, replayed by TF Serving before it serves."""
    import tensorflow as tf

    # The vendored protos (the wire format is TF Serving's own), not the tensorflow-serving-api wheel's.
    from tfs_protos.tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    with tf.io.TFRecordWriter(path) as writer:
        for size in WARMUP_BATCH_SIZES:
            batch = images[:size]
            pngs = [tf.io.encode_png(image).numpy() for image in batch]
            for signature, key, tensor in (
                (SIGNATURE_PIXELS, INPUT_PIXELS, tf.make_tensor_proto(batch, dtype=tf.uint8)),
                (SIGNATURE_BYTES, INPUT_BYTES, tf.make_tensor_proto(pngs, dtype=tf.string, shape=[len(pngs)])),
            ):
                request = predict_pb2.PredictRequest(
                    model_spec=model_pb2.ModelSpec(name=name, signature_name=signature))
                # TensorFlow's TensorProto class is not the vendored one: hand over its bytes.
                request.inputs[key].ParseFromString(tensor.SerializeToString())
                log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
                writer.write(log.SerializeToString())
