"""The tensor type system: Tensor (users) -> TensorImpl -> TensorMeta + Blob."""
