"""protoc plugin adapter: grpcio-tools links its gRPC Python generator into grpc_tools.protoc, not as a binary.

Reads a CodeGeneratorRequest on stdin, replays it through grpc_tools.protoc with --descriptor_set_in, and
answers a CodeGeneratorResponse with the generated *_pb2_grpc.py files.
"""
import os
import sys
import tempfile

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from grpc_tools import protoc


def main() -> int:
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    response = plugin_pb2.CodeGeneratorResponse()
    response.supported_features = plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    with tempfile.TemporaryDirectory() as tmp:
        fds = descriptor_pb2.FileDescriptorSet(file=request.proto_file)
        set_path = os.path.join(tmp, "set.pb")
        with open(set_path, "wb") as f:
            f.write(fds.SerializeToString())
        out = os.path.join(tmp, "out")
        os.mkdir(out)
        args = ["protoc", f"--descriptor_set_in={set_path}", f"--grpc_python_out={out}"]
        if request.parameter:
            args[-1] = f"--grpc_python_out={request.parameter}:{out}"
        rc = protoc.main(args + list(request.file_to_generate))
        if rc != 0:
            response.error = f"grpc_tools.protoc exited {rc}"
        else:
            for root, _, files in os.walk(out):
                for name in sorted(files):
                    path = os.path.join(root, name)
                    generated = response.file.add()
                    generated.name = os.path.relpath(path, out)
                    with open(path, encoding="utf-8") as f:
                        generated.content = f.read()
    sys.stdout.buffer.write(response.SerializeToString())
    return 0


if __name__ == "__main__":
    sys.exit(main())
