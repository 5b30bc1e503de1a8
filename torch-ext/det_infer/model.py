"""MegaModel: bit-exact inference for llama-family checkpoints (Llama, Qwen2, Qwen3, Mistral,
Gemma-3, Gemma-4 text models).

    mm = MegaModel.from_pretrained("path/to/model")          # config.json + safetensors, CPU engine
    mm = MegaModel.from_pretrained("path", device="cuda")    # the megakernel, one launch per call
    tokens = mm.generate(prompt_ids, max_new=128)             # one native call, prompt included
    logits = mm.decode_step(token_id, pos)                    # fp32 [vocab]
    streams = mm.generate_batch([ids_a, ids_b], max_new=64)   # up to batch_max() sequences

Every method runs the same per-token computation (docs/SPEC.md §13), so a sequence's logits are
the same bits alone or in a batch, prefilled at once or token by token, in one call or per step,
and on every executor:
    "engine"      the CPU engine (device="cpu", the default there)
    "megakernel"  the CUDA megakernel (device="cuda", the only one there): these bits on an H200
                  (sm_90, the one GPU run so far); compiled and audited for sm_75 to sm_120, the
                  other architectures not run (docs/RESULTS.md §9)
    "emulated"    the megakernel's device code on the CPU under SIMT emulation (device="cpu"; slow,
                  for verification without a GPU); geometry= sets its launch shape
"""
import functools
import json
import numbers
import os
import threading
import time

import torch

from . import bnb_io, names, safetensors_io
from ._ops import add_op_namespace_prefix, ops
from .config import ModelConfig
from .geometry import DEFAULT_GEOMETRY, GEOMETRY_FIELDS, TILE_ROWS, resolve_geometry  # noqa: F401 (names users import)
from .kv_state import KVState, check_memory

BATCH_MAX = 16
EXECUTORS = {"cpu": ("engine", "emulated"), "cuda": ("megakernel",)}
MAX_POSITIONS = 1_000_000  # the rope reduction's validated bound (docs/SPEC.md §7.1)
DEFAULT_MAX_CONTEXT = 4096


def _is_int_id(t):
    """An int (numpy's too) or a one-element integer tensor; never a bool or a float."""
    if isinstance(t, torch.Tensor):
        return t.numel() == 1 and not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool
    return not isinstance(t, bool) and isinstance(t, numbers.Integral)


def check_max_new(max_new):
    """max_new, the tokens a generation may produce, must be a positive int."""
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise ValueError(f"det-infer: max_new must be a positive int, got {max_new!r}")


def unwrap_encoding(ids):
    """A tokenizer's output (a BatchEncoding or dict) as its input_ids; anything else as it is."""
    return ids["input_ids"] if hasattr(ids, "keys") and "input_ids" in ids else ids


def _resolve_directory(path, revision=None):
    if os.path.isdir(path):
        return path
    if os.path.exists(path):
        raise ValueError(f"det-infer: {path} is a file; from_pretrained takes a model directory "
                         "(config.json + safetensors)")
    if path.count("/") != 1 or path.startswith((".", "/")):
        raise FileNotFoundError(f"det-infer: no model directory at {path!r}")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FileNotFoundError(f"det-infer: {path!r} is not a local directory, and huggingface_hub is not "
                                "installed to fetch it from the Hub") from None
    try:
        return snapshot_download(path, revision=revision, allow_patterns=["*.json", "*.safetensors"])
    except Exception as e:  # network, auth, missing repo: say what happened
        raise FileNotFoundError(f"det-infer: could not fetch {path!r} from the Hub: {e}") from e


def _exclusive(method):
    """One call at a time per model: a method that reads and advances a KV state (the default one,
    or the caller's) runs whole before another thread's call on the same model starts. Two models
    are independent."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return wrapper


def _resolve_device(device, executor):
    """(device string, executor) after checking the pair is supported here."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"det-infer: {device!r} is not a device; supported: 'cpu', 'cuda'") from None
    if dev.type not in EXECUTORS:
        raise ValueError(f"det-infer: device {str(dev)!r} is not supported; supported: 'cpu', 'cuda'")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("det-infer: device 'cuda' needs a CUDA build of torch and a GPU; neither is available "
                             "here (use device='cpu')")
        dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    executor = executor or EXECUTORS[dev.type][0]
    if executor not in EXECUTORS[dev.type]:
        raise ValueError(f"det-infer: executor {executor!r} does not run on {dev.type}; supported there: "
                         f"{', '.join(EXECUTORS[dev.type])}")
    return str(dev), executor


def native_model(tensor_names, weights, scales, cfg_ints, eps, inv_freq):
    """The native model (torch.classes.<ns>.Model): the weights bound by name (names[i] names
    weights[i]) and checked against the config once, at load."""
    namespace = add_op_namespace_prefix("Model").split("::")[0]
    return getattr(torch.classes, namespace).Model(list(tensor_names), weights, scales, cfg_ints, eps, inv_freq)


class MegaModel:
    def __init__(self, config: ModelConfig, tensors: dict, *, device="cpu", max_context=None, executor=None,
                 geometry=None):
        self.device, self.executor = _resolve_device(device, executor)
        self.geometry = resolve_geometry(self.executor, geometry)
        self.config = config
        tensors, packed = bnb_io.unpack(tensors, names.projection_shapes(config))
        if packed and config.quantization != "nf4":
            raise ValueError("det-infer: the checkpoint holds nf4-quantized tensors but config.json has no "
                             "bitsandbytes quantization_config")
        weights, scales = names.select_llama_weights(config, tensors, packed)
        self._inv_freq = config.inv_freq()
        if self.device != "cpu":
            check_memory(sum(t.numel() * t.element_size() for t in weights + scales), "the weights", self.device)
            weights = [w.to(self.device) for w in weights]
            scales = [s.to(self.device) for s in scales]
            self._inv_freq = self._inv_freq.to(self.device)
        self._weights = weights
        self._scales = scales  # nf4 absmax per weight (empty tensors for dense ones), or [] (names.py)
        self._cfg_ints = config.engine_ints()
        # Handed to the native side once: every op call takes this object (torch-ext/model_args.h).
        self._native = native_model(names.llama_tensor_names(config), weights, scales, self._cfg_ints,
                                    config.rms_norm_eps, self._inv_freq)
        limit = min(config.max_position_embeddings, MAX_POSITIONS)
        self.max_context = min(DEFAULT_MAX_CONTEXT if max_context is None else max_context, limit)
        if self.max_context < 1:
            raise ValueError(f"det-infer: max_context must be positive, got {max_context}")
        self._state = None
        self._lock = threading.RLock()  # see _exclusive
        self.source = None  # {"format", "files"} when loaded from files (certificate.py)
        self.weights_version = 0  # update_weights' count; a KVState remembers the one it was filled under
        self.weights_updated = False  # the files in source no longer identify the weights (certificate.py)

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path, device="cpu", max_context=None, revision=None, executor=None, geometry=None):
        """Load a Hugging Face model directory (config.json + model.safetensors or shards); a Hub
        id is fetched through huggingface_hub when installed and reachable. device "cpu" runs the
        CPU engine (or executor="emulated"), "cuda" the megakernel."""
        directory = _resolve_directory(str(path), revision)
        cfg_path = os.path.join(directory, "config.json")
        if not os.path.exists(cfg_path):
            raise FileNotFoundError(f"det-infer: {directory} has no config.json")
        with open(cfg_path) as f:
            try:
                cfg = ModelConfig.from_dict(json.load(f))
            except json.JSONDecodeError as e:
                raise ValueError(f"det-infer: {cfg_path} is not valid JSON ({e})") from None
        mm = cls(cfg, safetensors_io.load_checkpoint(directory), device=device, max_context=max_context,
                 executor=executor, geometry=geometry)
        mm.source = {"format": "safetensors", "files": [cfg_path] + safetensors_io.checkpoint_files(directory)}
        mm.model_dir = directory
        return mm

    @classmethod
    def from_gguf(cls, path, device="cpu", max_context=None, executor=None, geometry=None):
        """Load a llama.cpp GGUF checkpoint (llama, mistral, qwen2, qwen3, gemma3 architectures; any tensor type the
        gguf package can dequantize), rounding every tensor to bf16 once at load (gguf_io.py)."""
        from . import gguf_io

        if not os.path.isfile(str(path)):
            raise FileNotFoundError(f"det-infer: no GGUF file at {str(path)!r}")
        config, tensors = gguf_io.read_gguf(path)
        mm = cls(ModelConfig.from_dict(config), tensors, device=device, max_context=max_context, executor=executor,
                 geometry=geometry)
        mm.gguf_path = str(path)
        mm.source = {"format": "gguf", "files": [str(path)]}
        return mm

    @classmethod
    def load(cls, path, device="cpu", max_context=None, executor=None, geometry=None):
        """from_gguf for a path ending in .gguf, else from_pretrained (a model directory or a Hub id):
        what the command-line tools and the integrations (lm-eval, Ray Data) call with a user's path."""
        path = os.fspath(path)
        load = cls.from_gguf if path.endswith(".gguf") else cls.from_pretrained
        return load(path, device=device, max_context=max_context, executor=executor, geometry=geometry)

    def tokenizer(self):
        """The model's own tokenizer through transformers: the GGUF's (from_gguf) or the model
        directory's (from_pretrained)."""
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ImportError("det-infer: tokenizer() needs transformers (pip install transformers)") from None
        path = getattr(self, "gguf_path", None)
        if path is not None:
            # The tokenizer class AutoTokenizer would pick from the file's config, named so that it
            # does not derive that config by parsing the whole header once more with gguf-py (15 s
            # for Gemma-3's 262,144-token vocabulary; tests/test_gemma.py and test_qwen2.py check
            # that the two agree).
            from .gguf_io import GGUF_TOKENIZER_TYPES

            kind = GGUF_TOKENIZER_TYPES.get(self.config.family)
            extra = {"tokenizer_type": kind} if kind else {}
            return AutoTokenizer.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path),
                                                 **extra)
        directory = getattr(self, "model_dir", None)
        if directory is None:
            raise ValueError("det-infer: this model was built from tensors, not loaded from a directory or GGUF, "
                             "so it has no tokenizer of its own")
        try:
            return AutoTokenizer.from_pretrained(directory)
        except (OSError, ValueError) as e:
            raise ValueError(f"det-infer: {directory} has no tokenizer transformers can load ({e})") from None

    @_exclusive
    def update_weights(self, tensors):
        """Replace weights in place, by checkpoint name ({name: tensor}, any subset, e.g. a trainer's
        state_dict(); bf16, fp16 or fp32 on any device, rounded to bf16 once as at load). Every name,
        dtype and shape is checked first: on an error nothing changes. Afterwards the model gives
        exactly the logits of a fresh load of the new weights; KV states filled before the update
        must be prefilled again (continuing one is an error), and the model no longer has a file
        identity for certificates. Not for nf4 or GGUF models."""
        from . import weight_update

        updates = weight_update.prepare(self, tensors)
        if not updates:
            return  # nothing but ignored entries (rotary buffers, a tied head equal to the embedding)
        weights = list(self._weights)
        for i, w in updates.items():
            weights[i] = w
        native = native_model(names.llama_tensor_names(self.config), weights, self._scales, self._cfg_ints,
                              self.config.rms_norm_eps, self._inv_freq)
        self._weights, self._native = weights, native
        self.weights_version += 1
        self.source = None
        self.weights_updated = True
        if self._state is not None:
            self._state.reset()

    @staticmethod
    def batch_max() -> int:
        return BATCH_MAX

    def layer_plan(self) -> list:
        """The steps both executors run per tile of rows (docs/SPEC.md §13.1, §14.2), in order: dicts
        of kind ("embed", "qkv", "rope", "attend", "mlp", "residual", "head", Gemma-4's "ple_*"),
        layer (-1 for the model's own steps), weight_rows and k (the step streams weight_rows rows of
        k weights; 0 for a step without a matrix) and out_norm (a residual step's second phase)."""
        kinds, fields = ops.layer_plan(self._native)
        return [dict(kind=kind, layer=layer, weight_rows=rows, k=k, out_norm=bool(norm))
                for kind, (layer, rows, k, norm) in zip(kinds, zip(*[iter(fields)] * 4))]

    # ---- validation ---------------------------------------------------------------------------
    def _ids(self, ids, what="prompt"):
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"det-infer: {what} must be a sequence of token ids, not a string (tokenize it first)")
        ids = unwrap_encoding(ids)
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"det-infer: {what} must be a 1-d integer tensor or a list of ints")
            ids = ids.tolist()
        try:
            ids = list(ids)
        except TypeError:
            raise TypeError(f"det-infer: {what} must be a sequence of token ids") from None
        odd = [t for t in ids if not _is_int_id(t)]
        if odd:  # int(2.7) would be 2: a float is never silently taken for an id
            raise TypeError(f"det-infer: {what} must be a sequence of integer token ids, got {odd[0]!r} "
                            f"({type(odd[0]).__name__})")
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError(f"det-infer: {what} is empty")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ValueError(f"det-infer: token id {bad[0]} in {what} is outside the vocabulary [0, {self.config.vocab_size})")
        return ids

    def _check_length(self, n):
        if n > self.max_context:
            raise ValueError(f"det-infer: {n} positions exceed max_context {self.max_context} "
                             f"(model limit {min(self.config.max_position_embeddings, MAX_POSITIONS)}); "
                             "pass max_context= to from_pretrained")

    # ---- the raw calls --------------------------------------------------------------------------
    def _geometry_list(self):
        return [self.geometry[k] for k in GEOMETRY_FIELDS]

    def _forward(self, tokens, positions, states, cache_index, want):
        first = {}
        for i, p in zip(cache_index, positions):
            first.setdefault(i, p)
        for i, s in enumerate(states):  # a state continued past position 0 must hold these weights' K/V
            if first.get(i, 0) > 0 and s.weights_version != self.weights_version:
                raise ValueError("det-infer: this KV state was filled before update_weights replaced the weights; "
                                 "prefill it again (or reset() it) to continue with the new weights")
        n_want = int(sum(want))
        logits = torch.empty((n_want, self.config.vocab_size), dtype=torch.float32, device=self.device)
        args = (self._native, torch.tensor(tokens, dtype=torch.int32), torch.tensor(positions, dtype=torch.int64),
                [s.cache for s in states], torch.tensor(cache_index, dtype=torch.int64),
                torch.tensor(want, dtype=torch.uint8), logits)
        if self.executor == "engine":
            ops.mak_forward(*args)
        else:
            ops.mega_forward(*args, self._geometry_list())
        for s in states:  # only once the call has written their new positions
            s.weights_version = self.weights_version
        return logits

    def _new_kv(self, capacity):
        state = KVState(self.config, capacity, self.device)
        state.weights_version = self.weights_version
        return state

    def new_state(self, capacity=None) -> KVState:
        capacity = self.max_context if capacity is None else capacity
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"det-infer: a state's capacity must be a positive int, got {capacity!r}")
        self._check_length(capacity)
        return self._new_kv(capacity)

    @property
    def state(self) -> KVState:
        """The KV state used by prefill / decode_step (created on first use)."""
        if self._state is None:
            self._state = self.new_state()
        return self._state

    @_exclusive
    def reset(self):
        """Forget the default state's positions."""
        self.state.reset()

    @_exclusive
    def fork(self) -> KVState:
        """A copy of the default state, to continue two ways from one prefix."""
        return self.state.fork()

    # ---- the API ------------------------------------------------------------------------------
    @_exclusive
    def prefill(self, ids, state: KVState = None, logits="last"):
        """Fill positions 0..n-1 of the state with the prompt (the state is reset first). Returns
        the fp32 logits of the last token, or of every token with logits="all"."""
        state = state or self.state
        state.reset()
        return self.extend(ids, state, logits)

    @_exclusive
    def extend(self, ids, state: KVState = None, logits="last"):
        """Append tokens at the state's next positions in one call (a prefill, or a piece of one:
        any split gives the same bits). Returns the last token's logits, or all with logits="all"."""
        if logits not in ("last", "all"):
            raise ValueError(f"det-infer: logits must be 'last' or 'all', got {logits!r}")
        ids = self._ids(ids)
        state = state or self.state
        start = state.length
        if start + len(ids) > state.capacity:
            raise ValueError(f"det-infer: {len(ids)} tokens after {start} filled positions do not fit a "
                             f"{state.capacity}-position state")
        want = [1] * len(ids) if logits == "all" else [0] * (len(ids) - 1) + [1]
        out = self._forward(ids, list(range(start, start + len(ids))), [state], [0] * len(ids), want)
        state.length = start + len(ids)
        return out if logits == "all" else out[0]

    @_exclusive
    def decode_step(self, token_id, pos, state: KVState = None):
        """Run one token at position pos and return its fp32 [vocab] logits. pos may be the next
        free position or an earlier one (the state is then cut back to pos)."""
        state = state or self.state
        (token_id,) = self._ids([token_id], "token_id")
        if isinstance(pos, bool) or not isinstance(pos, int):
            raise TypeError(f"det-infer: pos must be an int, got {pos!r}")
        if not 0 <= pos <= state.length:
            raise ValueError(f"det-infer: position {pos} cannot be decoded: positions 0..{state.length - 1} are "
                             f"filled, so pos must be in [0, {state.length}]")
        if pos >= state.capacity:
            raise ValueError(f"det-infer: position {pos} is beyond the state's capacity {state.capacity}")
        logits = self._forward([token_id], [pos], [state], [0], [1])[0]
        state.length = pos + 1
        return logits

    def decode_step_timed(self, token_id, pos, state: KVState = None):
        """decode_step plus its time in seconds: device time (CUDA events) on a GPU, wall time on
        the CPU."""
        if self.device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            logits = self.decode_step(token_id, pos, state)
            end.record()
            end.synchronize()
            return logits, start.elapsed_time(end) / 1000.0
        t = time.perf_counter()
        logits = self.decode_step(token_id, pos, state)
        return logits, time.perf_counter() - t

    @_exclusive
    def decode_batch(self, token_ids, positions, states):
        """One decode step for several sequences at once: row b is token_ids[b] at positions[b] of
        states[b]. Returns (B, vocab) fp32 logits."""
        if not 1 <= len(states) <= BATCH_MAX or len(token_ids) != len(states) or len(positions) != len(states):
            raise ValueError(f"det-infer: decode_batch takes 1..{BATCH_MAX} sequences with one token, position "
                             "and state each")
        if len({id(s) for s in states}) != len(states):
            raise ValueError("det-infer: a state appears twice in one decode_batch")
        token_ids = self._ids(token_ids, "token_ids")
        for p, s in zip(positions, states):
            if not (isinstance(p, int) and 0 <= p <= s.length and p < s.capacity):
                raise ValueError(f"det-infer: position {p} is not decodable in a state with {s.length} filled "
                                 f"positions and capacity {s.capacity}")
        logits = self._forward(token_ids, list(positions), list(states), list(range(len(states))), [1] * len(states))
        for p, s in zip(positions, states):
            s.length = p + 1
        return logits

    @staticmethod
    def _sampling(B, temperature, top_k, top_p, min_p, seed):
        """Per-sequence sampling parameters as the ops take them: (sample_f (B, 3) float32
        [temperature, top_p, min_p], sample_i (B, 2) int64 [top_k, seed]), or two empty tensors when
        every sequence is greedy. Each parameter is one value or a list of B (docs/SPEC.md §15)."""
        def per_seq(name, value):
            if isinstance(value, (list, tuple)):
                if len(value) != B:
                    raise ValueError(f"det-infer: {name} has {len(value)} values for {B} prompts")
                return list(value)
            return [value] * B

        def number(name, v, ok, rule):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not ok(v):
                raise ValueError(f"det-infer: {name} must be {rule}, got {v!r}")
            return v

        rows_f, rows_i, sampled = [], [], False
        for t, k, p, m, sd in zip(per_seq("temperature", temperature), per_seq("top_k", top_k),
                                  per_seq("top_p", top_p), per_seq("min_p", min_p), per_seq("seed", seed)):
            t = number("temperature", t, lambda v: v >= 0 and v != float("inf"), "a finite number >= 0")
            p = number("top_p", p, lambda v: 0 < v <= 1, "in (0, 1]")
            m = number("min_p", m, lambda v: 0 <= v <= 1, "in [0, 1]")
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < 2**31:
                raise ValueError(f"det-infer: top_k must be an int >= 0 (0: off), got {k!r}")
            if isinstance(sd, bool) or not isinstance(sd, int) or not 0 <= sd < 2**64:
                raise ValueError(f"det-infer: seed must be an int in [0, 2**64), got {sd!r}")
            sampled = sampled or t > 0
            rows_f.append([t, p, m])
            rows_i.append([k, sd - 2**64 if sd >= 2**63 else sd])
        if not sampled:
            return torch.empty(0, dtype=torch.float32), torch.empty(0, dtype=torch.int64)
        return torch.tensor(rows_f, dtype=torch.float32), torch.tensor(rows_i, dtype=torch.int64)

    def _stop_ids(self, stop_on_eos, stop_ids):
        ids = stop_ids.tolist() if isinstance(stop_ids, torch.Tensor) else list(stop_ids or [])
        odd = [t for t in ids if not _is_int_id(t)]
        if odd:
            raise TypeError(f"det-infer: stop_ids must be integer token ids, got {odd[0]!r} ({type(odd[0]).__name__})")
        if stop_on_eos:
            ids += list(self.config.eos_token_ids)
        return torch.tensor(ids, dtype=torch.int32)

    def _generate_args(self, prompts, max_new, stop_on_eos, stop_ids, return_logits, temperature, top_k, top_p,
                       min_p, seed):
        """The checked prompts, the generate ops' arguments (ending in the outputs: tokens,
        lengths, step logits) and the sampling tensors of a generate_batch call."""
        prompts = [self._ids(p, f"prompt {i}") for i, p in enumerate(prompts)]
        sample_f, sample_i = self._sampling(len(prompts), temperature, top_k, top_p, min_p, seed)
        states = []
        for p in prompts:
            self._check_length(len(p) + max_new)
            states.append(self._new_kv(len(p) + max_new))
        B, V = len(prompts), self.config.vocab_size
        offsets = [0]
        for p in prompts:
            offsets.append(offsets[-1] + len(p))
        dev = self.device
        out = torch.empty((B, max_new), dtype=torch.int32, device=dev)
        lengths = torch.empty(B, dtype=torch.int64, device=dev)
        step_logits = torch.empty((B, max_new, V) if return_logits else (0,), dtype=torch.float32, device=dev)
        args = (self._native, torch.tensor([t for p in prompts for t in p], dtype=torch.int32),
                torch.tensor(offsets, dtype=torch.int64), torch.zeros(B, dtype=torch.int64),
                [s.cache for s in states], max_new, self._stop_ids(stop_on_eos, stop_ids), sample_f, sample_i,
                out, lengths, step_logits)
        return prompts, args, sample_f, sample_i

    @_exclusive
    def generate_batch(self, prompts, max_new=128, *, stop_on_eos=False, stop_ids=None, return_logits=False,
                       temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, return_logprobs=False):
        """Generation for up to batch_max() prompts (any lengths) in one native call. Greedy at
        temperature 0 (the default); otherwise seeded sampling (docs/SPEC.md §15), each of
        temperature, top_k, top_p, min_p and seed one value or a list with one per prompt. A
        sequence samples the same alone or in any batch. Returns a list of token lists (and, with
        return_logits, a list of (steps, vocab) fp32 tensors; with return_logprobs, a list of (steps,)
        fp32 logprobs of the chosen tokens under the distribution each was drawn from: the kept
        set's at the sampling temperature, or the plain log-softmax when greedy; SPEC §15.1)."""
        if not isinstance(prompts, (list, tuple)) or not 1 <= len(prompts) <= BATCH_MAX:
            raise ValueError(f"det-infer: generate_batch takes 1..{BATCH_MAX} prompts, got "
                             f"{len(prompts) if isinstance(prompts, (list, tuple)) else type(prompts).__name__}")
        check_max_new(max_new)
        prompts, args, sample_f, sample_i = self._generate_args(prompts, max_new, stop_on_eos, stop_ids, return_logits,
                                                                temperature, top_k, top_p, min_p, seed)
        out, lengths, step_logits = args[-3:]
        B = len(prompts)
        if self.executor == "engine":
            ops.mak_generate(*args)
        else:
            ops.mega_generate(*args, self._geometry_list())
        out, lengths = out.cpu(), lengths.cpu()
        streams = [out[b, : lengths[b]].tolist() for b in range(B)]
        result = (streams,)
        if return_logits:
            result += ([step_logits[b, : lengths[b]] for b in range(B)],)
        if return_logprobs:
            from . import scoring

            if return_logits:
                result += ([scoring.chosen_logprobs(step_logits[b, : lengths[b]].cpu(), streams[b], sample_f,
                                                    sample_i, b) for b in range(B)],)
            else:  # teacher-forced: the same logits (prefill = decode), never a (B, steps, vocab) block
                result += (scoring.generated_logprobs(self, prompts, streams, sample_f, sample_i),)
        return result if len(result) > 1 else streams

    @_exclusive
    def generate(self, prompt_ids, max_new=128, single_launch=True, *, stop_on_eos=False, stop_ids=None,
                 return_logits=False, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0,
                 return_logprobs=False):
        """Greedy generation (temperature 0), or seeded sampling with temperature, top_k, top_p,
        min_p and seed (docs/SPEC.md §15). single_launch=True: the whole generation, prompt
        included, in one native call. single_launch=False: one call for the prompt, then one per
        token (same tokens, same logits). Returns the tokens, then with return_logits the (steps,
        vocab) logits, then with return_logprobs the chosen tokens' logprobs (see generate_batch)."""
        if single_launch:
            res = self.generate_batch([prompt_ids], max_new, stop_on_eos=stop_on_eos, stop_ids=stop_ids,
                                      return_logits=return_logits, temperature=temperature, top_k=top_k,
                                      top_p=top_p, min_p=min_p, seed=seed, return_logprobs=return_logprobs)
            return tuple(r[0] for r in res) if (return_logits or return_logprobs) else res[0]
        check_max_new(max_new)
        ids = self._ids(prompt_ids)
        sample_f, sample_i = self._sampling(1, temperature, top_k, top_p, min_p, seed)
        self._check_length(len(ids) + max_new)
        state = self._new_kv(len(ids) + max_new)
        stops = self._stop_ids(stop_on_eos, stop_ids)
        logits = self.prefill(ids, state)
        tokens, all_logits = [], []
        for step in range(max_new):
            if sample_f.numel():
                (t, p, m), (k, sd) = sample_f[0].tolist(), sample_i[0].tolist()
                tok = int(ops.sample_token(logits.cpu(), t, k, p, m, sd, state.length))
            else:
                tok = int(ops.argmax_f32(logits.cpu()))
            tokens.append(tok)
            all_logits.append(logits)
            if not ops.decode_continues(tok, step, max_new, stops):  # the executors' rule (det_program.h)
                break
            logits = self.decode_step(tok, state.length, state)
        result = (tokens,)
        if return_logits:
            result += (torch.stack(all_logits),)
        if return_logprobs:
            from . import scoring

            result += (scoring.chosen_logprobs(torch.stack(all_logits).cpu(), tokens, sample_f, sample_i, 0),)
        return result if len(result) > 1 else tokens

    @_exclusive
    def score(self, context_ids, continuation_ids, *, top_k=0, temperature=1.0, sampling=None):
        """The contract's logprob of each continuation token after the context (docs/SPEC.md
        §15.1), whether it was the argmax and its rank, and with top_k > 0 the k best (id, logprob)
        per position: a scoring.Score. sampling={"top_k", "top_p", "min_p"} adds the sampler's kept
        set per position and each token's renormalized logprob in it. The same bits alone or in any
        score_batch."""
        return self.score_batch([(context_ids, continuation_ids)], top_k=top_k, temperature=temperature,
                                sampling=sampling)[0]

    @_exclusive
    def score_batch(self, pairs, *, top_k=0, temperature=1.0, sampling=None):
        """score() for any number of (context_ids, continuation_ids) pairs, run batch_max() at a time;
        results in the pairs' order, each bit-identical to scoring it alone."""
        from . import scoring

        return scoring.score_pairs(self, pairs, top_k=top_k, temperature=temperature, sampling=sampling)

    def generate_text(self, prompt, max_new=128, *, chat=False, stop=None, stop_on_eos=True, **sampling):
        """Text in, text out, through the model's own tokenizer (tokenizer()). chat=True applies
        the model's chat template to prompt (a user message, or a list of {"role", "content"}
        messages) with the assistant's turn opened. The reply is cut before the first of the
        `stop` strings it contains, and generation ends there (text.py); sampling takes generate's
        temperature, top_k, top_p, min_p, seed."""
        if not hasattr(self, "_tokenizer"):
            self._tokenizer = self.tokenizer()
        tok = self._tokenizer
        if chat:
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            if not getattr(tok, "chat_template", None):
                raise ValueError("det-infer: this model's tokenizer has no chat template; pass chat=False")
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        elif isinstance(prompt, str):
            ids = tok(prompt)["input_ids"]
        else:
            raise TypeError(f"det-infer: prompt must be a string (or, with chat=True, a list of messages), "
                            f"got {type(prompt).__name__}")
        from . import text

        decode = lambda t: tok.decode(t, skip_special_tokens=True)  # noqa: E731
        return text.generate_until(self, [self._ids(ids)], max_new, decode, text.check_stops(stop),
                                   stop_on_eos=stop_on_eos, **sampling)[0][1]

    @_exclusive
    def teacher_forced_logits(self, ids) -> torch.Tensor:
        """(len(ids), vocab) fp32 logits of every position of ids, on a fresh state."""
        ids = self._ids(ids)
        self._check_length(len(ids))
        return self.prefill(ids, self._new_kv(len(ids)), logits="all")
