"""flexcomm.proto: the gRPC API (proto/flexcomm/v1/*.proto) and its generated code.

    from flexcomm.proto import agent_pb2, agent_pb2_grpc

The generated modules live in `flexcomm.proto.flexcomm.v1` (protoc's layout);
regenerate them with `python proto/generate.py` after editing a .proto file.
"""

from flexcomm.proto.flexcomm.v1 import agent_pb2, agent_pb2_grpc

__all__ = ["agent_pb2", "agent_pb2_grpc"]
