"""The task heads: one module per task (``embed``, ``classify``, ``ner``, ``tabular``, ``generate``, ``image_classify``,
``image_embed``), each loading its model and turning a batch into the task's output columns, and the helpers they
share (transformers' tokenizers and labels, vision models, generation's decoding, sentence-transformers' fallback)."""
