"""Tiny models and data built locally: nothing is downloaded, ever.

- tokenizer: a char-level HF tokenizer with a chat template.
- models: a Llama-style causal LM and a sequence-classification reward model.
- arithmetic: the bundled arithmetic task as parquet in verl's schema.
"""
