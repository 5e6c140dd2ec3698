"""The model: the Llama decoder (``llama``), its loss (``loss``: cross-entropy without every token's
logits at once), its layout on the devices (``parallelize``: mesh, activation checkpointing, compile, FSDP2,
the optimizer) and Hugging Face weights in and out (``hf``).

May import: ``base``, ``config``, ``data`` (a Hugging Face model's tokenizer), ``torch_private``. Nothing of
``checkpoint``: a model knows nothing of how it is saved.
"""
