"""Ray Data: generation and scoring as a Dataset.map_batches stage, every row's output the bits it
has alone, whichever actor, batch, order or machine computed it (rows.py does a batch's work).

    ds = ray.data.from_items([{"id": i, "prompt_ids": ids} for i, ids in enumerate(prompts)])
    out = di.ray_data.generate(ds, "path/to/SmolLM2-135M", max_new=64, concurrency=4)
    out.write_parquet("generations/")

Only this module imports Ray (the package loads it on first use of di.ray_data). Each actor is a
process of its own that loads the package and the model once. The package's module name is the
kernel build's (e.g. _det_infer_cpu_73f7ad6906), which a worker cannot import by name, so this
module travels to workers by value and DetInferPredictor imports the package there itself: from the
directory the driver loaded it from, or, on a node without that directory, with kernels.get_kernel
(docs/RAY.md: a multi-node cluster).
"""
import importlib.util
import os
import sys

try:
    import pyarrow as pa
    from ray import cloudpickle as _cloudpickle
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("det-infer: di.ray_data needs Ray Data: pip install 'ray[data]==2.60.0'") from e

_PACKAGE = __package__
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_cloudpickle.register_pickle_by_value(sys.modules[__name__])

TASKS = ("generate", "score")
GENERATE_TYPES = {"tokens": pa.list_(pa.int32()), "logprobs": pa.list_(pa.float32()), "finish_reason": pa.string(),
                  "certificate_root": pa.string(), "certificate": pa.string()}
SCORE_TYPES = {"logprobs": pa.list_(pa.float32()), "greedy": pa.list_(pa.bool_()), "ranks": pa.list_(pa.int64()),
               "total": pa.float64(), "is_greedy": pa.bool_(), "top_ids": pa.list_(pa.list_(pa.int64())),
               "top_logprobs": pa.list_(pa.list_(pa.float32())), "kept_logprobs": pa.list_(pa.float32())}
COMMON_TYPES = {"model_sha256": pa.string(), "contract_version": pa.int32(), "error": pa.string()}


def _package():
    """This package in the calling process (a worker imports it on first use). Only the standard
    library is used here: this function runs in workers before the package exists there."""
    if _PACKAGE in sys.modules:
        return sys.modules[_PACKAGE]
    init = os.path.join(_PACKAGE_DIR, "__init__.py")
    if os.path.isfile(init):
        spec = importlib.util.spec_from_file_location(_PACKAGE, init, submodule_search_locations=[_PACKAGE_DIR])
        module = importlib.util.module_from_spec(spec)
        sys.modules[_PACKAGE] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[_PACKAGE]
            raise
        return module
    try:
        from kernels import get_kernel
    except ImportError:
        raise ImportError(f"det-infer: this Ray node has neither {_PACKAGE_DIR} nor the kernels package to load "
                          "det-infer with (pip install kernels on every node: docs/RAY.md)") from None
    return get_kernel("phanerozoic/det-infer", version=1, trust_remote_code=True)


class DetInferPredictor:
    """A callable class for Dataset.map_batches: each actor loads the model once (a model
    directory or Hub id for from_pretrained, or a .gguf file for from_gguf, with device, executor
    and max_context), then maps batches of rows to the rows plus their output columns.

    task="generate": rows with `prompt_ids` (and optional per-row max_new, temperature, top_k,
    top_p, min_p, seed); options max_new, stop_ids, stop_on_eos, certificates and the sampling
    keywords as the call's defaults. Adds tokens, logprobs, finish_reason, certificate_root
    (certificate with certificates=True), model_sha256, contract_version and error.
    task="score": rows with `context_ids` and `continuation_ids`; options top_k, temperature,
    sampling as MegaModel.score takes them. Adds logprobs, greedy, ranks, total, is_greedy (top_ids,
    top_logprobs, kept_logprobs when asked), model_sha256, contract_version and error.

    A row that cannot run gets its message in `error` and nulls; the batch's other rows complete."""

    def __init__(self, model, *, task="generate", device="cpu", executor=None, max_context=None, **options):
        self._stage = _package().ray_data._Stage(model, task, device, executor, max_context, options)

    def __call__(self, batch):
        return self._stage(batch)


class _Stage:
    """The model and the row runner of one actor (built in the worker, never pickled)."""

    def __init__(self, model, task, device, executor, max_context, options):
        from . import rows
        from .model import MegaModel

        _check_task(task)
        path = os.fspath(model)
        self.mm = MegaModel.load(path, device=device, max_context=max_context, executor=executor)
        runner = rows.RowGenerator if task == "generate" else rows.RowScorer
        self.rows = runner(self.mm, **options)
        self.types = {**(GENERATE_TYPES if task == "generate" else SCORE_TYPES), **COMMON_TYPES}

    def __call__(self, batch):
        table = _as_table(batch)
        for name, values in self.rows(table).items():
            if name in table.column_names:  # an output replaces an input column of its name
                table = table.drop_columns([name])
            table = table.append_column(name, pa.array(values, type=self.types[name]))
        return table


def _as_table(batch):
    """A batch of any of Ray's formats (pyarrow, pandas, a dict of numpy columns) as a pyarrow Table."""
    if isinstance(batch, pa.Table):
        return batch
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas
        return pa.Table.from_pandas(batch, preserve_index=False)
    from .rows import _py

    return pa.table({name: pa.array([_py(v) for v in column]) for name, column in batch.items()})


def _check_task(task):
    if task not in TASKS:
        raise ValueError(f"det-infer: task must be one of {TASKS}, got {task!r}")


def _pool(concurrency):
    """Ray Data's actor pool for `concurrency`: n actors, (min, max) to autoscale, None for Ray's
    default (1 to as many as the cluster holds)."""
    from ray.data import ActorPoolStrategy

    def count(v):
        return not isinstance(v, bool) and isinstance(v, int) and v >= 1

    if concurrency is None:
        return None
    if count(concurrency):
        return ActorPoolStrategy(size=concurrency)
    if isinstance(concurrency, tuple) and len(concurrency) == 2 and all(map(count, concurrency)) \
            and concurrency[0] <= concurrency[1]:
        return ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1])
    raise ValueError(f"det-infer: concurrency must be a number of actors n >= 1, a (min, max) pair or None, "
                     f"got {concurrency!r}")


def _map(ds, model, task, options, *, device, executor, max_context, batch_size, concurrency, num_cpus, num_gpus):
    from .model import BATCH_MAX

    _check_task(task)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"det-infer: batch_size must be a positive int (rows per actor call; {BATCH_MAX} run "
                         f"together), got {batch_size!r}")
    if num_gpus is None:
        num_gpus = 1 if str(device).startswith("cuda") else 0
    return ds.map_batches(DetInferPredictor, batch_size=batch_size, batch_format="pyarrow", compute=_pool(concurrency),
                          num_cpus=num_cpus, num_gpus=num_gpus,
                          fn_constructor_kwargs=dict(model=os.fspath(model), task=task, device=device,
                                                     executor=executor, max_context=max_context, **options))


def generate(ds, model, *, max_new, batch_size=16, concurrency=None, device="cpu", executor=None, max_context=None,
             stop_ids=None, stop_on_eos=False, certificates=False, num_cpus=1, num_gpus=None, **sampling):
    """ds with each row's generation added (DetInferPredictor, task "generate"): a lazy Dataset,
    run by Ray when consumed. concurrency: actors (None: Ray's default); num_cpus: CPUs each actor
    reserves, and the threads it runs; num_gpus: 1 per actor for device "cuda"."""
    from . import certificate

    unknown = set(sampling) - set(certificate.SAMPLING_FIELDS)
    if unknown:
        raise TypeError(f"det-infer: unknown keyword(s) {sorted(unknown)}; sampling takes {certificate.SAMPLING_FIELDS}")
    options = dict(max_new=max_new, stop_ids=stop_ids, stop_on_eos=stop_on_eos, certificates=certificates, **sampling)
    _check_generate_options(options)
    return _map(ds, model, "generate", options, device=device, executor=executor, max_context=max_context,
                batch_size=batch_size, concurrency=concurrency, num_cpus=num_cpus, num_gpus=num_gpus)


def score(ds, model, *, top_k=0, temperature=1.0, sampling=None, batch_size=16, concurrency=None, device="cpu",
          executor=None, max_context=None, num_cpus=1, num_gpus=None):
    """ds with each (context_ids, continuation_ids) row's scores added (DetInferPredictor, task
    "score"): a lazy Dataset, run by Ray when consumed. The other arguments as generate's."""
    from . import scoring

    scoring._check_sampling(sampling)
    scoring._check_options(2**31, top_k, temperature)  # the vocabulary's bound is the actors' to check
    options = dict(top_k=top_k, temperature=temperature, sampling=sampling)
    return _map(ds, model, "score", options, device=device, executor=executor, max_context=max_context,
                batch_size=batch_size, concurrency=concurrency, num_cpus=num_cpus, num_gpus=num_gpus)


def _check_generate_options(options):
    """The call-level settings every actor would reject, rejected before any actor starts."""
    from .certificate import SAMPLING_DEFAULTS
    from .model import MegaModel, _is_int_id, check_max_new

    check_max_new(options["max_new"])
    MegaModel._sampling(1, **{k: options.get(k, v) for k, v in SAMPLING_DEFAULTS.items()})
    stop_ids = options["stop_ids"]
    if stop_ids is not None and not all(map(_is_int_id, stop_ids)):  # the actors' rule (MegaModel._stop_ids)
        raise TypeError(f"det-infer: stop_ids must be a list of integer token ids, got {stop_ids!r}")
