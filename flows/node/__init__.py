"""Operations on one training node: the model's train/publish slot (a kernel file lock beside the shards)
and `ctrpipe warm-node`, which readies a node's shards and spec before its torchrun."""
