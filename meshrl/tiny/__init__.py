"""Tiny models and data built locally: nothing is downloaded, ever.

- tokenizer: a char-level HF tokenizer with a chat template.
- models: a Llama-style causal LM and a sequence-classification reward model.
- arithmetic: the bundled arithmetic task as parquet in verl's schema.
- bpe: a byte-level BPE tokenizer with a ChatML chat template (tool roles too), trained locally on a task's text.
- visual: the bundled visual task (name a drawn shape's colour and kind) as parquet in verl's multimodal schema.
- code: the bundled code task (write f(x) for a described mapping), graded by running it in the sandbox.
"""
