"""Model shapes.

"debug" is a few million parameters so that every test can run on CPU under torchrun in
seconds; the llama3 flavours are the published shapes (Llama 3.2 1B/3B, Llama 3.1 8B) so
that an exported checkpoint loads in transformers. Standard library only.
"""

# Llama 3.2 (1B, 3B) extends Llama 3's 8k context 32-fold with the same RoPE scaling.
_LLAMA_3_2_ROPE_SCALING = {
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

FLAVORS: dict[str, dict] = {
    "debug": {
        "dim": 256,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "ffn_dim": 768,
        "vocab_size": 256,  # byte-level tokens: the built-in corpus needs no tokenizer
        "norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
    },
    "llama3_1b": {
        "dim": 2048,
        "n_layers": 16,
        "n_heads": 32,
        "n_kv_heads": 8,
        "ffn_dim": 8192,
        "vocab_size": 128256,
        "norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": dict(_LLAMA_3_2_ROPE_SCALING),
        "tie_word_embeddings": True,
    },
    "llama3_3b": {
        "dim": 3072,
        "n_layers": 28,
        "n_heads": 24,
        "n_kv_heads": 8,
        "ffn_dim": 8192,
        "vocab_size": 128256,
        "norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": dict(_LLAMA_3_2_ROPE_SCALING),
        "tie_word_embeddings": True,
    },
    "llama3_8b": {
        "dim": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 8,
        "ffn_dim": 14336,
        "vocab_size": 128256,
        "norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": False,
    },
}
