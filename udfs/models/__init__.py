"""Models on the executors: where a model's files come from (local, hub, Hadoop URI, MLflow) and which weights they
hold, the per-process cache, whether a model fits its task, and what runs its forward (torch, ONNX Runtime, int8)."""
