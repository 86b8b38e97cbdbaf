"""Vendor TF Serving's .proto files and regenerate the Python modules the gRPC transport uses.

The modules in ``tensorflow_serving.apis`` import the ``tensorflow`` package, so the client
cannot use them. This script keeps a copy of the .proto definitions it needs here (proto
packages unchanged, ``tensorflow`` and ``tensorflow.serving``, so the wire format and the gRPC
method paths match a real TF Serving), compiles them with grpcio-tools, and rewrites the
generated imports to point inside ``tfs_protos``.

Typical usage (from the repository root; needs ``pip install grpcio-tools``)::

    python -m tfs_protos.regenerate              # recompile the vendored .proto files
    python -m tfs_protos.regenerate --vendor     # first re-extract them from the installed
                                                    # tensorflow / tensorflow-serving-api wheels

The wheels ship no .proto files, only compiled descriptors, so ``--vendor`` reads the serialized
``FileDescriptorProto`` out of each ``*_pb2.py`` source (without importing it) and prints it back
as .proto text, then checks that protoc compiles that text to the same descriptor.
"""

import argparse
import ast
import os
import re
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "tfs_protos"
#: Where the vendored definitions come from; recorded in SOURCE_VERSION's first line when re-vendored
#: (the lines after it name the sources of the files vendored by hand, which --vendor leaves alone).
SOURCE = "tensorflow-serving-api 2.21.0 / tensorflow 2.21.0"
#: The files the client and the server use; everything they import comes along.
ROOTS = (
    "tensorflow_serving/apis/prediction_service.proto",
    "tensorflow_serving/apis/model_service.proto",
    "tensorflow_serving/apis/prediction_log.proto",  # export writes TF Serving's warmup records with it
    "tensorflow/core/protobuf/saved_model.proto",  # the server reads signatures from saved_model.pb
)
#: Shipped with protobuf itself; imported, never vendored.
WELL_KNOWN = "google/protobuf/"


def _pb2_source(proto_name, site_packages):
    module = proto_name[: -len(".proto")] + "_pb2.py"
    for prefix in ("", "tensorflow/", "tensorflow/compiler/"):
        path = os.path.join(site_packages, prefix, module)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"no compiled module for {proto_name} under {site_packages}")


def load_descriptor(proto_name, site_packages):
    """The FileDescriptorProto serialized in an installed ``*_pb2.py``, read without importing it."""
    from google.protobuf import descriptor_pb2

    with open(_pb2_source(proto_name, site_packages)) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            return descriptor_pb2.FileDescriptorProto.FromString(node.args[0].value)
    raise ValueError(f"no serialized descriptor in the module for {proto_name}")


def closure(site_packages):
    found, todo = {}, list(ROOTS)
    while todo:
        name = todo.pop()
        if name in found or name.startswith(WELL_KNOWN):
            continue
        found[name] = load_descriptor(name, site_packages)
        todo.extend(found[name].dependency)
    return found


# --- FileDescriptorProto -> .proto text -------------------------------------------------------

_SCALARS = {
    1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32",
    8: "bool", 9: "string", 12: "bytes", 13: "uint32", 15: "sfixed32", 16: "sfixed64",
    17: "sint32", 18: "sint64",
}


def _value(field, value):
    if field.type == field.TYPE_STRING or field.type == field.TYPE_BYTES:
        return '"' + (value if isinstance(value, str) else value.decode("latin-1")).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if field.type == field.TYPE_BOOL:
        return "true" if value else "false"
    if field.type == field.TYPE_ENUM:
        return field.enum_type.values_by_number[value].name
    return str(value)


def _options(options):
    return [(f.name, _value(f, v)) for f, v in options.ListFields()]


def _json_default(name):
    parts = name.split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def _type(field):
    return field.type_name if field.type_name else _SCALARS[field.type]


def _ranges(ranges, inclusive_end):
    out = []
    for r in ranges:
        end = r.end - (0 if inclusive_end else 1)
        out.append(str(r.start) if end == r.start else f"{r.start} to {'max' if end >= 536870911 else end}")
    return ", ".join(out)


def _field(field, maps, proto3, indent):
    opts = _options(field.options)
    if field.HasField("default_value"):
        opts.insert(0, ("default", field.default_value if field.type in (field.TYPE_ENUM, field.TYPE_BOOL) or field.type not in (field.TYPE_STRING, field.TYPE_BYTES) else '"' + field.default_value + '"'))
    if field.HasField("json_name") and field.json_name != _json_default(field.name):
        opts.append(("json_name", f'"{field.json_name}"'))
    suffix = " [" + ", ".join(f"{k} = {v}" for k, v in opts) + "]" if opts else ""
    if field.type_name in maps:
        key, value = maps[field.type_name]
        return f"{indent}map<{_type(key)}, {_type(value)}> {field.name} = {field.number}{suffix};"
    if field.label == field.LABEL_REPEATED:
        label = "repeated "
    elif field.proto3_optional or (not proto3 and field.label == field.LABEL_OPTIONAL):
        label = "optional "
    elif field.label == field.LABEL_REQUIRED:
        label = "required "
    else:
        label = ""
    return f"{indent}{label}{_type(field)} {field.name} = {field.number}{suffix};"


def _enum(enum, indent, out):
    out.append(f"{indent}enum {enum.name} {{")
    for k, v in _options(enum.options):
        out.append(f"{indent}  option {k} = {v};")
    for value in enum.value:
        opts = _options(value.options)
        suffix = " [" + ", ".join(f"{k} = {v}" for k, v in opts) + "]" if opts else ""
        out.append(f"{indent}  {value.name} = {value.number}{suffix};")
    if enum.reserved_range:
        out.append(f"{indent}  reserved {_ranges(enum.reserved_range, True)};")
    if enum.reserved_name:
        out.append(f"{indent}  reserved " + ", ".join(f'"{n}"' for n in enum.reserved_name) + ";")
    out.append(f"{indent}}}")


def _message(message, scope, proto3, indent, out):
    full = f"{scope}.{message.name}"
    maps = {
        f"{full}.{nested.name}": (nested.field[0], nested.field[1])
        for nested in message.nested_type
        if nested.options.map_entry
    }
    out.append(f"{indent}message {message.name} {{")
    inner = indent + "  "
    for k, v in _options(message.options):
        out.append(f"{inner}option {k} = {v};")
    for enum in message.enum_type:
        _enum(enum, inner, out)
    # protoc appends a map field's entry type to nested_type where the field appears, so nested
    # messages and fields are interleaved to keep both lists in their original order.
    printed_oneofs = set()
    fields = list(message.field)
    done = 0

    def emit_fields(until):
        nonlocal done
        for field in fields[done:until]:
            real_oneof = field.HasField("oneof_index") and not field.proto3_optional
            if not real_oneof:
                out.append(_field(field, maps, proto3, inner))
                continue
            if field.oneof_index in printed_oneofs:
                continue
            printed_oneofs.add(field.oneof_index)
            oneof = message.oneof_decl[field.oneof_index]
            out.append(f"{inner}oneof {oneof.name} {{")
            for k, v in _options(oneof.options):
                out.append(f"{inner}  option {k} = {v};")
            for member in fields:
                if member.HasField("oneof_index") and member.oneof_index == field.oneof_index:
                    out.append(_field(member, maps, proto3, inner + "  "))
            out.append(f"{inner}}}")
        done = max(done, until)

    for nested in message.nested_type:
        if nested.options.map_entry:
            entry = f"{full}.{nested.name}"
            emit_fields(1 + next(i for i, f in enumerate(fields) if f.type_name == entry))
        else:
            _message(nested, full, proto3, inner, out)
    emit_fields(len(fields))
    if message.reserved_range:
        out.append(f"{inner}reserved {_ranges(message.reserved_range, False)};")
    if message.reserved_name:
        out.append(f"{inner}reserved " + ", ".join(f'"{n}"' for n in message.reserved_name) + ";")
    if message.extension_range or message.extension:
        raise NotImplementedError(f"extensions in {full}")
    out.append(f"{indent}}}")


def to_proto_text(fd):
    """.proto source that protoc compiles back to ``fd`` (comments are not in descriptors)."""
    proto3 = fd.syntax == "proto3"
    out = [f"// Reconstructed from the descriptor in {SOURCE}; regenerate with tfs_protos/regenerate.py.", ""]
    out.append(f'syntax = "{fd.syntax or "proto2"}";')
    out.append("")
    out.append(f"package {fd.package};")
    out.append("")
    public = set(fd.public_dependency)
    for i, dep in enumerate(fd.dependency):
        out.append(f'import {"public " if i in public else ""}"{dep}";')
    if fd.dependency:
        out.append("")
    for k, v in _options(fd.options):
        out.append(f"option {k} = {v};")
    if fd.options.ListFields():
        out.append("")
    for enum in fd.enum_type:
        _enum(enum, "", out)
        out.append("")
    for message in fd.message_type:
        _message(message, "." + fd.package, proto3, "", out)
        out.append("")
    for service in fd.service:
        out.append(f"service {service.name} {{")
        for k, v in _options(service.options):
            out.append(f"  option {k} = {v};")
        for m in service.method:
            cs = "stream " if m.client_streaming else ""
            ss = "stream " if m.server_streaming else ""
            opts = _options(m.options)
            body = " {\n" + "".join(f"    option {k} = {v};\n" for k, v in opts) + "  }" if opts else ";"
            out.append(f"  rpc {m.name}({cs}{m.input_type}) returns ({ss}{m.output_type}){body}")
        out.append("}")
        out.append("")
    if fd.extension:
        raise NotImplementedError(f"extensions in {fd.name}")
    return "\n".join(out).rstrip() + "\n"


def _protoc(args):
    from grpc_tools import protoc
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    code = protoc.main(["grpc_tools.protoc", f"-I{HERE}", f"-I{include}", *args])
    if code != 0:
        raise SystemExit(f"protoc failed with code {code}")


def vendor(site_packages):
    """Write the .proto closure of ROOTS under tfs_protos, and prove it compiles to the original descriptors."""
    from google.protobuf import descriptor_pb2

    found = closure(site_packages)
    for name, fd in found.items():
        path = os.path.join(HERE, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(to_proto_text(fd))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "set.pb")
        _protoc([f"--descriptor_set_out={out}", *sorted(found)])
        with open(out, "rb") as f:
            compiled = {fd.name: fd for fd in descriptor_pb2.FileDescriptorSet.FromString(f.read()).file}
    for name, original in found.items():
        again = compiled[name]
        for fd in (original, again):
            _normalise(fd)
        if again != original:
            raise SystemExit(f"{name}: the reconstructed .proto does not compile to the original descriptor")
    path = os.path.join(HERE, "SOURCE_VERSION")
    with open(path) as f:
        by_hand = f.read().splitlines()[1:]  # the lines of the files vendored by hand (their .proto says how)
    with open(path, "w") as f:
        f.write("\n".join([SOURCE, *by_hand]) + "\n")
    print(f"vendored {len(found)} .proto files from {site_packages}; all round-trip to the original descriptors")
    return sorted(found)


def _normalise(fd):
    """Drop what protoc may legitimately write differently: json names, the order of map entry types."""

    def walk(messages):
        for m in messages:
            for field in m.field:
                field.ClearField("json_name")
            walk(m.nested_type)
            ordered = sorted(m.nested_type, key=lambda n: n.name)
            m.ClearField("nested_type")
            m.nested_type.extend(ordered)

    walk(fd.message_type)


def vendored():
    names = []
    for root, _, files in os.walk(HERE):
        names += [os.path.relpath(os.path.join(root, f), HERE) for f in files if f.endswith(".proto")]
    return sorted(names)


def compile_protos():
    """Compile the vendored .proto files into ``*_pb2.py`` / ``*_pb2_grpc.py`` inside tfs_protos."""
    names = vendored()
    _protoc([f"--python_out={HERE}", f"--grpc_python_out={HERE}", *names])
    top = sorted({n.split("/")[0] for n in names})
    pattern = re.compile(r"^(from|import) (" + "|".join(map(re.escape, top)) + r")([.\s])", re.M)
    for root, _, files in os.walk(HERE):
        if root != HERE and "__pycache__" not in root and not os.path.exists(os.path.join(root, "__init__.py")):
            open(os.path.join(root, "__init__.py"), "w").close()
        for f in files:
            path = os.path.join(root, f)
            if f.endswith("_pb2_grpc.py") and "class " not in open(path).read():
                os.remove(path)  # grpcio-tools writes one for every file, with or without a service
                continue
            if f.endswith(("_pb2.py", "_pb2_grpc.py")):
                with open(path) as src:
                    text = src.read()
                with open(path, "w") as dst:
                    dst.write(_private_pool(pattern.sub(rf"\1 {PACKAGE}.\2\3", text)))
    print(f"compiled {len(names)} .proto files into {PACKAGE}")


def _private_pool(text):
    # The generated files keep their original names (tensorflow/core/framework/tensor.proto, ...),
    # which TensorFlow registers in protobuf's default pool too; a private pool keeps the two apart
    # in a process that has both loaded, whatever TensorFlow version that is.
    if "_descriptor_pool.Default().AddSerializedFile(" not in text:
        return text
    text = text.replace("_descriptor_pool.Default().AddSerializedFile(", "_protos.POOL.AddSerializedFile(")
    return text.replace(
        "from google.protobuf import descriptor_pool as _descriptor_pool\n",
        f"from google.protobuf import descriptor_pool as _descriptor_pool\nimport {PACKAGE} as _protos\n",
        1,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vendor", action="store_true", help="re-extract the .proto files from the installed wheels first")
    parser.add_argument(
        "--site-packages",
        default=sysconfig.get_paths()["purelib"],
        help="where tensorflow and tensorflow_serving are installed (default: this interpreter's)",
    )
    args = parser.parse_args(argv)
    if args.vendor:
        vendor(args.site_packages)
    compile_protos()


if __name__ == "__main__":
    sys.exit(main())
