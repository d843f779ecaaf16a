"""Protocol buffer messages of baechi_tf.

`cost_profile.proto` defines the `CostProfile` file format; `cost_profile_pb2` is its generated
module, committed so that nothing needs protoc at run time (it needs protobuf >= 7.35.1, < 8).
The `.proto` file says how to regenerate it.
"""

__all__: list[str] = []
