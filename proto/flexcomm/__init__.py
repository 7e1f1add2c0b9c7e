"""flexcomm.proto.flexcomm: protoc output root (see proto/generate.py)."""
