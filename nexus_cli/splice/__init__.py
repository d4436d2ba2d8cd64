"""KV splicing: tools compiled into .atb blocks and spliced into a live llama.cpp context."""
