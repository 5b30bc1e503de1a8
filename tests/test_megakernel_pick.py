"""The megakernel's greedy pick (det_mk_phase_argmax) under emulation keeps the contract's total
order (docs/SPEC.md §10) however its threads split the logits: each thread takes four logits per
16-byte load where the row is aligned and the rest one at a time, so ties meet in different threads
and in the tail loop."""
import sys
from pathlib import Path

import pytest
import torch
from det_fixtures import synthetic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_gpu import random_weights  # noqa: E402


@pytest.mark.parametrize("vocab,tied", [(1000, 150), (1001, 1000)])
def test_greedy_pick_gives_ties_to_the_lowest_id(di, vocab, tied):
    """The head's rows are zero but for ids 7 and `tied` (one vector w) and 300 (-w): every step's
    top logit is tied between 7 and `tied` (x.w > 0), or is 300's (x.w < 0). Id 7 is thread 1's,
    150 thread 37's at 64 threads; with 1,001 ids, 1,000 is left to the loop after the 16-byte
    loads. Tokens equal the CPU engine's, and a tie never goes to `tied`."""
    cfg = di.ModelConfig.from_dict(dict(synthetic.CONFIGS["llama"], vocab_size=vocab))
    weights = random_weights(di, cfg, "cpu")
    head = torch.zeros_like(weights["lm_head.weight"])
    w = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(3)).to(head.dtype)
    head[7], head[tied], head[300] = w, w, -w
    weights["lm_head.weight"] = head
    prompt = [3, 17, 42, 99, 5, 250, 11]
    want = di.MegaModel(cfg, weights, max_context=64).generate(prompt, max_new=8)
    got = di.MegaModel(cfg, weights, max_context=64, executor="emulated",
                       geometry=dict(grid=2, warps=2)).generate(prompt, max_new=8)
    assert got == want
    assert set(got) <= {7, 300} and 7 in got, got
