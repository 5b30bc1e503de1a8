"""det-infer's decode benchmark in the kernels hub convention: `kernels benchmark
phanerozoic/det-infer --version 1` (or `kernels benchmark ./` in a checkout with build/) runs every
benchmarks/benchmark*.py and times each `benchmark_*` workload on the machine's device.

This is the hub-runnable form of the project's decode benchmark (benchmarks/bench_gpu.py, which
scripts/device_check.sh runs; benchmarks/bench_cpu.py for the CPU): a model with the shapes of
SmolLM2-135M-Instruct and seeded random bf16 weights made on the device (speed does not depend on the
values, and kernel-builder uploads only benchmarks/benchmark*.py, so nothing else can be read here),
then one decode step at batch 1 and one at batch 16. Each workload's verify_* is the product's own
promise, checked bit for bit: the step's logits equal the teacher-forced logits of the same sequence
(token by token == prefill), and each row of the batch-16 step equals the same sequence stepped
alone (batch invariance). The runner's tolerance (atol 1e-2) is looser than this; a mismatch raises.
"""
import torch

from kernels.benchmark import Benchmark

# SmolLM2-135M-Instruct's shapes (as in benchmarks/bench_gpu.py).
SMOLLM2_135M = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=576,
                    intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    head_dim=64, vocab_size=49152, rope_theta=100000.0, max_position_embeddings=8192,
                    rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu", bos_token_id=1, eos_token_id=2)
MAX_CONTEXT = 128
PROMPT_LEN = 32
BATCH = 16


def _shape(cfg, name):
    H, D, I, V = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    QD, KVD = cfg.num_attention_heads * D, cfg.num_key_value_heads * D
    for key, shape in (("embed_tokens", (V, H)), ("lm_head", (V, H)), ("q_proj", (QD, H)), ("k_proj", (KVD, H)),
                       ("v_proj", (KVD, H)), ("o_proj", (H, QD)), ("gate_proj", (I, H)), ("up_proj", (I, H)),
                       ("down_proj", (H, I)), ("q_norm", (D,)), ("k_norm", (D,))):
        if key in name:
            return shape
    return (H,)  # the RMSNorm weights


def _model(di, device, config=SMOLLM2_135M, seed=0):
    cfg = di.ModelConfig.from_dict(config)
    g = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for name in di.names.llama_tensor_names(cfg):
        norm = "norm" in name
        w = torch.randn(_shape(cfg, name), generator=g, device=device) * (0.1 if norm else 0.02)
        weights[name] = (w + (1.0 if norm else 0.0)).to(torch.bfloat16)
    return di.MegaModel(cfg, weights, device=device, max_context=MAX_CONTEXT)


def _prompt(n, salt, vocab):
    return [(97 * i + 31 * salt) % (vocab - 3) + 3 for i in range(n)]


class DecodeBenchmark(Benchmark):
    """One decode step after a prompt, at batch 1 and batch 16 (the figures of docs/RESULTS.md §5/§9)."""

    seed = 0
    config = SMOLLM2_135M

    def setup_decode_b1(self):
        self.mm = _model(self.kernel, self.device, self.config)
        self.ids = _prompt(PROMPT_LEN, 0, self.config["vocab_size"])
        self.state = self.mm.new_state(PROMPT_LEN + 1)
        self.mm.extend(self.ids, self.state)

    def benchmark_decode_b1(self):
        # decode_step at the next position; called again it rewinds to that position first.
        self.out = self.mm.decode_step(self.ids[1], PROMPT_LEN, self.state)

    def verify_decode_b1(self) -> torch.Tensor:
        ref = self.mm.teacher_forced_logits(self.ids + [self.ids[1]])[-1]
        if not torch.equal(self.out, ref):
            raise AssertionError("decode_step logits differ from the teacher-forced logits of the same tokens")
        return ref

    def setup_decode_b16(self):
        self.mm = _model(self.kernel, self.device, self.config)
        vocab = self.config["vocab_size"]
        self.prompts = [_prompt(8 + 3 * b, b, vocab) for b in range(BATCH)]
        self.tokens = [(7 * b + 11) % (vocab - 3) + 3 for b in range(BATCH)]
        self.states = [self.mm.new_state(len(p) + 1) for p in self.prompts]
        for p, s in zip(self.prompts, self.states):
            self.mm.extend(p, s)
        self.alone = [self.mm.new_state(len(p) + 1) for p in self.prompts]
        for p, s in zip(self.prompts, self.alone):
            self.mm.extend(p, s)

    def benchmark_decode_b16(self):
        self.out = self.mm.decode_batch(self.tokens, [len(p) for p in self.prompts], self.states)

    def verify_decode_b16(self) -> torch.Tensor:
        ref = torch.stack([self.mm.decode_step(t, len(p), s) for t, p, s in zip(self.tokens, self.prompts, self.alone)])
        if not torch.equal(self.out, ref):
            raise AssertionError("a row of the batch-16 step differs from the same sequence stepped alone")
        return ref
