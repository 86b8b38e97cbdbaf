"""NumPy arrays to and from TensorFlow's ``TensorProto``, through the vendored protos (no TensorFlow).

What ``tf.make_tensor_proto`` and ``tf.make_ndarray`` do for the dtypes a TF Serving signature
uses: numbers travel packed little-endian in ``tensor_content``, strings in ``string_val``.
Reading also accepts the typed ``*_val`` fields, with TensorFlow's rule that a shorter list
repeats its last value (one value fills the whole tensor).
"""

import numpy as np

from tfs_protos.tensorflow.core.framework import tensor_pb2, types_pb2

#: numpy dtype -> (DT_* enum, the typed field TensorFlow reads when tensor_content is empty)
_NUMERIC = {
    np.dtype(np.float32): (types_pb2.DT_FLOAT, "float_val"),
    np.dtype(np.float64): (types_pb2.DT_DOUBLE, "double_val"),
    np.dtype(np.float16): (types_pb2.DT_HALF, "half_val"),
    np.dtype(np.int8): (types_pb2.DT_INT8, "int_val"),
    np.dtype(np.int16): (types_pb2.DT_INT16, "int_val"),
    np.dtype(np.int32): (types_pb2.DT_INT32, "int_val"),
    np.dtype(np.int64): (types_pb2.DT_INT64, "int64_val"),
    np.dtype(np.uint8): (types_pb2.DT_UINT8, "int_val"),
    np.dtype(np.uint16): (types_pb2.DT_UINT16, "int_val"),
    np.dtype(np.uint32): (types_pb2.DT_UINT32, "uint32_val"),
    np.dtype(np.uint64): (types_pb2.DT_UINT64, "uint64_val"),
    np.dtype(np.bool_): (types_pb2.DT_BOOL, "bool_val"),
}
_BY_ENUM = {enum: (dtype, field) for dtype, (enum, field) in _NUMERIC.items()}


def to_proto(array):
    """A ``TensorProto`` holding ``array`` (numbers, or an ``object``/``bytes``/``str`` array of strings)."""
    array = np.asarray(array)
    proto = tensor_pb2.TensorProto()
    for size in array.shape:
        proto.tensor_shape.dim.add().size = size
    if array.dtype == object or array.dtype.kind in "SU":
        proto.dtype = types_pb2.DT_STRING
        proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1).tolist())
        return proto
    if array.dtype not in _NUMERIC:
        raise ValueError(f"cannot send a {array.dtype.name} tensor to TF Serving")
    proto.dtype = _NUMERIC[array.dtype][0]
    proto.tensor_content = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return proto


def typed_field(dtype_enum):
    """The typed field (``float_val``, ``int_val``...) TensorFlow reads a ``dtype_enum`` tensor's values from without ``tensor_content``."""
    return _BY_ENUM[dtype_enum][1]


def to_array(proto):
    """The NumPy array a ``TensorProto`` holds (strings as an ``object`` array of ``bytes``)."""
    shape = [d.size for d in proto.tensor_shape.dim]
    count = int(np.prod(shape, dtype=np.int64))
    if proto.dtype == types_pb2.DT_STRING:
        values = list(proto.string_val)
        return _filled(np.array(values, dtype=object), count, object).reshape(shape)
    if proto.dtype not in _BY_ENUM:
        raise ValueError(f"cannot read a {types_pb2.DataType.Name(proto.dtype)} tensor")
    dtype, field = _BY_ENUM[proto.dtype]
    if proto.tensor_content:
        return np.frombuffer(proto.tensor_content, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)
    values = getattr(proto, field)
    if dtype == np.float16:  # half_val holds the raw 16-bit patterns as ints
        values = np.asarray(values, dtype=np.uint16).view(np.float16)
    return _filled(np.asarray(values, dtype=dtype), count, dtype).reshape(shape)


def _filled(values, count, dtype):
    if len(values) == count:
        return values
    if len(values) == 0 or len(values) > count:
        raise ValueError(f"a tensor of {count} values holds {len(values)}")
    return np.concatenate([values, np.full(count - len(values), values[-1], dtype=dtype)])
