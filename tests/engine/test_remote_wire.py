"""Remote engine against scripted loopback servers: llama-server timings and progress, usage counts,
unknowns as None, HTTP and stream errors, the API key kept secret, URL and option handling."""

from __future__ import annotations

import argparse

import pytest
from remote_support import ScriptedServer, content_chunk, free_port, sse

from chatphase.engine.config import EngineConfig
from chatphase.engine.events import (
    EngineFailed,
    FirstToken,
    Message,
    ModelLoaded,
    PrefillProgress,
    PrefillStarted,
    SamplingParams,
    ThinkingEnded,
    TokensDecoded,
    TurnFinished,
    TurnRequest,
)
from chatphase.engine.factory import make_engine
from chatphase.engine.remote.engine import RemoteEngine
from chatphase.engine.remote.url import ServerURL
from chatphase.engine.remote.wire import ServerReport, remote_turn_metrics
from chatphase.errors import UsageError

pytestmark = pytest.mark.timeout(60)

MODELS = {
    "object": "list",
    "data": [{"id": "tiny", "object": "model", "meta": {"n_params": 134515008, "size": 98000000, "n_ctx_train": 8192}}],
}
PROPS = {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1, "model_path": "/srv/tiny.gguf"}
TIMINGS = {
    "prompt_n": 30,
    "prompt_ms": 12.5,
    "prompt_per_second": 2400.0,
    "cache_n": 10,
    "predicted_n": 4,  # 3 tokens of text and the end-of-generation token: llama-server counts it
    "predicted_ms": 30.0,
    "predicted_per_second": 100.0,
}


def _request(turn_id=1, text="Hi"):
    return TurnRequest(turn_id, (Message("user", text),), SamplingParams(max_tokens=8, temperature=0))


def _llama_server_routes(stream: list) -> dict:
    return {"GET /v1/models": (200, MODELS), "GET /props": (200, PROPS), "POST /v1/chat/completions": (200, stream)}


def _loaded(url, **kw) -> RemoteEngine:
    engine = RemoteEngine(url, **kw)
    events = list(engine.load())
    assert isinstance(events[-1], ModelLoaded), events
    return engine


def test_llama_server_timings_progress_and_usage_fill_the_metrics():
    stream = sse(
        {
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}],
            "prompt_progress": {"total": 40, "cache": 10, "processed": 25, "time_ms": 5.0},
        },
        {
            "choices": [{"index": 0, "delta": {}}],
            "prompt_progress": {"total": 40, "cache": 10, "processed": 40, "time_ms": 12.0},
        },
        content_chunk("Hel"),
        0.02,
        content_chunk("lo"),
        0.02,
        content_chunk("!"),
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "timings": TIMINGS,
            "usage": {"prompt_tokens": 40, "completion_tokens": 4, "total_tokens": 44},
        },
        "[DONE]",
    )
    with ScriptedServer(_llama_server_routes(stream)) as srv:
        engine = _loaded(srv.url + "/v1/")
        assert engine.loaded.settings.n_ctx == 2048 and engine.loaded.info.n_params == 134515008
        events = list(engine.run_turn(_request()))
        body = srv.requests[-1][3]
    assert body["stream_options"] == {"include_usage": True} and body["return_progress"] is True
    assert body["model"] == "tiny" and body["messages"] == [{"role": "user", "content": "Hi"}]
    assert isinstance(events[0], PrefillStarted) and events[0].prompt_tokens is None
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    assert [(p.done_tokens, p.total_tokens) for p in progress] == [(15, 30), (30, 30)]
    assert isinstance(events[3], FirstToken) and events[3].text == "Hel"
    assert [e.text for e in events if isinstance(e, TokensDecoded)] == ["lo", "!"]
    done = events[-1]
    assert isinstance(done, TurnFinished) and done.reply == "Hello!"
    m = done.metrics
    assert (m.prompt_tokens, m.cached_tokens, m.prefill_tokens, m.decode_tokens) == (40, 10, 30, 3)
    assert m.prefill_ms == 12.5 and m.prefill_tokens_per_s == pytest.approx(30 / 0.0125)
    assert m.stop_reason == "stop" and m.ttft_ms == pytest.approx(events[3].ttft_ms)
    assert m.decode_tokens_per_s == pytest.approx(2 / (m.decode_ms / 1000))
    assert m.itl_ms_p50 <= m.itl_ms_p95 <= m.itl_ms_max <= m.decode_ms and m.decode_ms > 0
    assert m.kv_cache_bytes is None and m.kv_bytes_per_token is None  # not exposed: unknown, not zero
    st = done.server_timings
    assert st["prompt_ms"] == 12.5 and st["cache_n"] == 10 and st["predicted_n"] == 4
    assert st["network_queue_ms"] == pytest.approx(m.ttft_ms - 12.5)


def test_plain_openai_server_sends_no_llama_server_fields_and_unknowns_stay_none():
    stream = sse(
        content_chunk("a"),
        content_chunk("b"),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        "[DONE]",
    )
    vllm_models = {"data": [{"id": "tiny", "object": "model", "max_model_len": 4096}]}
    routes = {"GET /v1/models": (200, vllm_models), "POST /v1/chat/completions": (200, stream)}
    with ScriptedServer(routes) as srv:
        engine = _loaded(srv.url)
        assert engine.loaded.settings.n_ctx == 4096 and engine.loaded.info.n_params is None
        req = TurnRequest(2, (Message("user", "x"),), SamplingParams(seed=7), reset_cache=True, ignore_eos=True)
        events = list(engine.run_turn(req))
        body = next(b for _m, path, _h, b in srv.requests if path == "/v1/chat/completions")
    assert "return_progress" not in body and "cache_prompt" not in body
    assert body["seed"] == 7 and body["ignore_eos"] is True
    m = events[-1].metrics
    assert m.stop_reason == "length" and events[-1].server_timings is None
    for name in (
        "prompt_tokens",
        "cached_tokens",
        "prefill_tokens",
        "prefill_ms",
        "decode_tokens",
        "decode_tokens_per_s",
        "tpot_ms",
        "kv_cache_tokens",
    ):
        assert getattr(m, name) is None, name
    assert m.ttft_ms is not None and m.itl_ms_max is not None


def test_api_key_sent_as_bearer_and_never_shown(monkeypatch):
    secret = "sk-test-DO-NOT-PRINT-123"
    monkeypatch.setenv("MY_SERVER_KEY", secret)
    routes = {
        "GET /v1/models": (200, MODELS),
        "POST /v1/chat/completions": (401, {"error": {"message": "Invalid API Key", "type": "authentication_error"}}),
    }
    with ScriptedServer(routes) as srv:
        engine = make_engine(None, EngineConfig(), server=srv.url, api_key_env="MY_SERVER_KEY")
        events = list(engine.load()) + list(engine.run_turn(_request()))
        headers = srv.requests[0][2]
    assert headers["Authorization"] == f"Bearer {secret}"
    failed = events[-1]
    assert isinstance(failed, EngineFailed) and not failed.fatal
    assert "401" in failed.message and "Invalid API Key" in failed.message and "--api-key-env" in failed.message
    assert all(secret not in repr(e) for e in events) and secret not in repr(engine)
    assert secret not in repr(engine.loaded)


def test_error_object_mid_stream_keeps_partial_reply():
    stream = sse(
        content_chunk("par"),
        content_chunk("tial"),
        {"error": {"code": 500, "message": "slot crashed", "type": "server_error"}},
    )
    with ScriptedServer(_llama_server_routes(stream)) as srv:
        events = list(_loaded(srv.url).run_turn(_request()))
    failed, finished = events[-2], events[-1]
    assert (
        isinstance(failed, EngineFailed)
        and "slot crashed" in failed.message
        and "partial reply is kept" in failed.message
    )
    assert (
        isinstance(finished, TurnFinished) and finished.reply == "partial" and finished.metrics.stop_reason == "error"
    )


def test_stream_ending_without_finish_is_an_error_not_a_stop():
    with ScriptedServer(_llama_server_routes(sse(content_chunk("half")))) as srv:
        events = list(_loaded(srv.url).run_turn(_request()))
    assert "ended before the reply was complete" in events[-2].message
    assert events[-1].metrics.stop_reason == "error" and events[-1].reply == "half"


def test_read_timeout_is_one_clear_failure():
    stream = sse(1.5, content_chunk("late"), "[DONE]")
    with ScriptedServer(_llama_server_routes(stream)) as srv:
        engine = RemoteEngine(srv.url, read_timeout_s=0.3)
        list(engine.load())
        events = list(engine.run_turn(_request()))
    assert isinstance(events[-1], EngineFailed) and "sent nothing for 0.3 s" in events[-1].message
    assert not any(isinstance(e, TurnFinished) for e in events)


def test_http_404_for_unknown_model_at_turn_time():
    routes = {
        "GET /v1/models": (404, {"detail": "Not Found"}),
        "POST /v1/chat/completions": (404, {"error": {"message": "The model `big` does not exist."}}),
    }
    with ScriptedServer(routes) as srv:
        engine = RemoteEngine(srv.url, remote_model="big")
        load = list(engine.load())
        assert isinstance(load[0], EngineFailed) and "HTTP 404" in load[0].message


def test_server_url_forms_and_errors():
    u = ServerURL("127.0.0.1:8080/v1/")
    assert str(u.api) == "http://127.0.0.1:8080/v1" and u.display == "http://127.0.0.1:8080"
    assert ServerURL("https://h.example/base").display == "https://h.example/base"
    for bad in ("ftp://host", "http://", "https://user:pw@h.example/base"):
        with pytest.raises(UsageError):
            ServerURL(bad)


def test_factory_and_options(monkeypatch):
    from chatphase.commands.options import settings_from_args
    from chatphase.commands.server_options import add_server_options, engine_for, model_info_for

    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(UsageError, match="NO_SUCH_KEY_VAR"):
        make_engine(None, EngineConfig(), server="http://127.0.0.1:9", api_key_env="NO_SUCH_KEY_VAR")
    with pytest.raises(UsageError, match="need --server"):
        make_engine(None, EngineConfig(), remote_model="x")
    p = argparse.ArgumentParser()
    add_server_options(p)
    args = p.parse_args(["--server", f"127.0.0.1:{free_port()}", "--remote-model", "m"])
    settings = settings_from_args(args)
    assert model_info_for(settings).name == "m"
    engine = engine_for(settings, None)
    assert isinstance(engine, RemoteEngine) and engine.remote_model == "m"


def test_metrics_from_report_prompt_counts_are_consistent():
    report = ServerReport(prompt_tokens=50, completion_tokens=4)
    report.timings = {"prompt_n": 20, "prompt_ms": 10.0}
    m = remote_turn_metrics(
        t_submit_ns=0, arrival_times_ns=[5_000_000, 6_000_000, 8_000_000, 11_000_000], report=report, stop_reason="stop"
    )
    assert (m.prompt_tokens, m.cached_tokens, m.prefill_tokens) == (50, 30, 20)
    assert m.ttft_ms == 5.0 and m.decode_ms == 6.0 and m.decode_tokens_per_s == pytest.approx(3 / 0.006)
    assert (m.itl_ms_p50, m.itl_ms_max) == (2.0, 3.0) and m.tpot_ms == 2.0
    with pytest.raises(ValueError):
        remote_turn_metrics(t_submit_ns=10, arrival_times_ns=[5], report=ServerReport(), stop_reason="stop")


def test_a_remote_turn_and_the_same_timestamps_through_the_local_path_give_the_same_figures():
    """One definition of every metric: a server turn whose chunks are one token each, with the counts the
    server reports, equals the local engine's turn with the same clock and counts, field for field (but
    what only one side knows: the local KV and tokenisation figures, who counted the remote tokens)."""
    from chatphase.engine.metrics import compute_turn_metrics
    from chatphase.engine.remote.wire import RemoteThinking

    ms = 1_000_000
    times = [(40 + 7 * i + i * i) * ms for i in range(9)]  # uneven gaps: the ITL percentiles interpolate
    report = ServerReport(prompt_tokens=50, cached_tokens=20, completion_tokens=9, reasoning_tokens=4)
    report.timings = {"prompt_ms": 12.5, "draft_n": 16, "draft_n_accepted": 12}
    report.finish_reason = "length"
    thinking = RemoteThinking(t_end_ns=times[3] + ms, t_first_answer_ns=times[4])
    remote = remote_turn_metrics(
        t_submit_ns=0, arrival_times_ns=times, report=report, stop_reason="length", thinking=thinking
    )
    local = compute_turn_metrics(
        t_submit_ns=0,
        t_prefill_start_ns=2 * ms,
        t_prefill_end_ns=2 * ms + round(12.5 * ms),
        token_times_ns=times,
        prompt_tokens=50,
        cached_tokens=20,
        kv_cache_tokens=59,
        kv_bytes_per_token=8,
        kv_capacity_bytes=4096,
        stop_reason="length",
        thinking_tokens=4,
        t_thinking_end_ns=times[3] + ms,
        spec={"spec_mode": "draft", "spec_drafted": 16, "spec_accepted": 12, "spec_acceptance": 0.75},
    )
    only_one_side = {"kv_cache_tokens", "kv_bytes_per_token", "kv_cache_bytes", "kv_capacity_bytes", "tokenize_ms"}
    only_one_side |= {"decode_tokens_source"}
    differ = {k: (v, local.to_dict()[k]) for k, v in remote.to_dict().items() if k not in only_one_side}
    assert {k: pair for k, pair in differ.items() if pair[0] != pair[1]} == {}
    assert remote.decode_tokens_source == "usage" and remote.kv_cache_bytes is None and remote.tokenize_ms is None
    assert remote.answer_tokens_per_s is not None and remote.itl_ms_p95 is not None and remote.thinking_ms == 31.0


def test_server_counts_that_cannot_be_are_unknown_not_negative():
    """More cached than prompt tokens (a server's bookkeeping gone wrong) gave a negative prefill count."""
    report = ServerReport(prompt_tokens=10, cached_tokens=30, completion_tokens=2)
    report.timings = {"prompt_ms": 4.0}
    m = remote_turn_metrics(t_submit_ns=0, arrival_times_ns=[5_000_000, 6_000_000], report=report, stop_reason="stop")
    assert (m.prompt_tokens, m.cached_tokens, m.prefill_tokens, m.prefill_tokens_per_s) == (10, None, None, None)
    assert m.prefill_ms == 4.0 and m.decode_tokens == 2


@pytest.mark.timeout(10)  # liveness bound: without the socket shutdown this waits out the 20 s read timeout
def test_cancel_while_waiting_for_the_first_token_returns_at_once():
    import threading

    release = threading.Event()  # the server stays silent until the turn has returned
    stream = sse(release, content_chunk("too late"), "[DONE]")
    with ScriptedServer(_llama_server_routes(stream)) as srv:
        engine = RemoteEngine(srv.url, read_timeout_s=20)
        list(engine.load())
        timer = threading.Timer(0.3, engine.cancel)
        timer.start()
        events = list(engine.run_turn(_request()))
        release.set()
        timer.join()
    done = events[-1]
    # a read timeout (EngineFailed) would mean the blocked read was waited out instead of interrupted
    assert not any(isinstance(e, (EngineFailed, FirstToken)) for e in events)
    assert isinstance(done, TurnFinished) and done.metrics.stop_reason == "cancelled" and done.reply == ""


def test_token_id_prompt_goes_to_completions_with_cache_reset_and_ignore_eos():
    def text_chunk(t):
        return {"object": "text_completion", "choices": [{"index": 0, "text": t, "finish_reason": None}]}

    stream = sse(
        text_chunk("x"),
        text_chunk("y"),
        {
            "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
            "timings": {"prompt_n": 64, "prompt_ms": 20.0, "cache_n": 0, "predicted_n": 2, "predicted_ms": 9.0},
        },
        "[DONE]",
    )
    routes = {"GET /v1/models": (200, MODELS), "GET /props": (200, PROPS), "POST /v1/completions": (200, stream)}
    with ScriptedServer(routes) as srv:
        engine = _loaded(srv.url)
        req = TurnRequest(
            3,
            prompt_token_ids=tuple(range(1, 65)),
            sampling=SamplingParams(max_tokens=2),
            reset_cache=True,
            ignore_eos=True,
        )
        events = list(engine.run_turn(req))
        body = srv.requests[-1][3]
    assert body["prompt"] == list(range(1, 65)) and "messages" not in body
    assert body["cache_prompt"] is False and body["ignore_eos"] is True
    m = events[-1].metrics
    assert events[-1].reply == "xy" and m.stop_reason == "length"
    assert (m.prompt_tokens, m.cached_tokens, m.prefill_tokens, m.decode_tokens) == (64, 0, 64, 2)


def test_a_server_that_does_not_stream_is_one_clear_failure():
    routes = {
        "GET /v1/models": (200, MODELS),
        "POST /v1/chat/completions": (200, {"choices": [{"message": {"content": "whole"}}]}),
    }
    with ScriptedServer(routes) as srv:
        events = list(_loaded(srv.url).run_turn(_request()))
    assert len(events) == 2 and isinstance(events[-1], EngineFailed)
    assert "did not stream its reply" in events[-1].message and "application/json" in events[-1].message


def test_a_stream_without_counts_is_counted_by_the_server_tokenizer_never_by_chunks():
    """Two chunks of text, no usage, no timings: llama-server's ``/tokenize`` counts the reply (5 tokens,
    not 2 chunks); one without a tokenizer endpoint leaves the count unknown."""
    stream = sse(
        content_chunk("Hello"),
        content_chunk(" there, friend"),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        "[DONE]",
    )
    routes = {**_llama_server_routes(stream), "POST /tokenize": (200, {"tokens": [9, 8, 7, 6, 5]})}
    with ScriptedServer(routes) as srv:
        engine = _loaded(srv.url)
        m = list(engine.run_turn(_request()))[-1].metrics
        tokenize_bodies = [body for method, path, _h, body in srv.requests if path == "/tokenize"]
    assert (m.decode_tokens, m.decode_tokens_source) == (5, "tokenizer")
    assert m.decode_tokens_per_s == pytest.approx(4 / (m.decode_ms / 1000))
    assert tokenize_bodies == [
        {"content": "", "add_special": False},
        {"content": "Hello there, friend", "add_special": False},
    ]
    assert engine.tokenizer.endpoint == "/tokenize"
    with ScriptedServer(_llama_server_routes(stream)) as srv:
        m = list(_loaded(srv.url).run_turn(_request()))[-1].metrics
    assert m.decode_tokens is None and m.decode_tokens_source is None and m.decode_tokens_per_s is None


def test_usage_counts_win_and_say_so():
    report = ServerReport()
    report.absorb({"usage": {"prompt_tokens": 7, "completion_tokens": 3}})
    report.tokenized_completion_tokens = 4
    assert report.decode_count() == (3, "usage")
    report = ServerReport(timings={"predicted_n": 6})
    assert report.decode_count() == (6, "timings")


def test_the_tokenizer_counter_takes_off_the_bos_its_endpoint_adds():
    from chatphase.engine.remote.tokens import ServerTokenizer

    calls = []

    def post(url, body):
        calls.append(url)
        if url.endswith("/tokenize") and not url.endswith("/extras/tokenize"):
            return None  # not llama-server
        return {"tokens": [1] + [42] * len(body["input"].split())}  # BOS + one token a word

    counter = ServerTokenizer(post, "http://127.0.0.1:9/", "smol", llama_server=False)
    assert counter.count("three small words") == 3 and counter.count("") == 0
    assert calls[0] == "http://127.0.0.1:9/extras/tokenize"  # llama-cpp-python's first when not llama-server
    dead = ServerTokenizer(lambda url, body: None, "http://127.0.0.1:9", None, llama_server=True)
    assert dead.count("x") is None and dead.count("y") is None and dead.endpoint is None


def _reasoning_chunk(text: str) -> dict:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"reasoning_content": text}}]}


def test_a_servers_reasoning_deltas_are_the_thinking_phase():
    stream = sse(
        _reasoning_chunk("The user"),
        0.01,
        _reasoning_chunk(" says hi."),
        0.01,
        content_chunk("Hello"),
        content_chunk("!"),
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 6, "completion_tokens_details": {"reasoning_tokens": 3}},
        },
        "[DONE]",
    )
    with ScriptedServer(_llama_server_routes(stream)) as srv:
        engine = _loaded(srv.url)
        history = (Message("user", "Hi"), Message("assistant", "Hey.", "A greeting."), Message("user", "Hi"))
        request = TurnRequest(2, history, SamplingParams(max_tokens=8), enable_thinking=True)
        events = list(engine.run_turn(request))
        body = srv.requests[-1][3]
    assert body["messages"][1] == {"role": "assistant", "content": "Hey.", "reasoning_content": "A greeting."}
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    first = next(e for e in events if isinstance(e, FirstToken))
    assert (first.text, first.thinking) == ("", "The user")
    (ended,) = [e for e in events if isinstance(e, ThinkingEnded)]
    done = events[-1]
    assert (done.reply, done.thinking) == ("Hello!", "The user says hi.")
    m = done.metrics
    assert (m.thinking_tokens, m.answer_tokens, m.decode_tokens) == (3, 2, 5)  # the server's, less its EOG
    assert m.thinking_ms == pytest.approx(ended.thinking_ms) and m.thinking_ms > 0 and not m.thinking_cut_short
    assert m.ttfa_ms > m.ttft_ms and m.thought


def test_thinking_markers_in_plain_content_are_split_too():
    stream = sse(
        content_chunk("<thi"),
        content_chunk("nk>Plan."),
        content_chunk("</think>\n\n"),
        content_chunk("Done."),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"completion_tokens": 5}},
        "[DONE]",
    )
    with ScriptedServer(_llama_server_routes(stream)) as srv:
        done = list(_loaded(srv.url).run_turn(_request()))[-1]
    assert (done.reply, done.thinking) == ("Done.", "Plan.")
    m = done.metrics
    assert m.thought and m.thinking_tokens is None and m.answer_tokens is None  # the server did not count them
    assert m.ttfa_ms is not None and not m.thinking_cut_short


def test_a_drafting_llama_server_reports_its_draft_figures():
    """llama-server sends ``draft_n`` / ``draft_n_accepted`` in its timings only when it drafted."""
    report = ServerReport(prompt_tokens=50, completion_tokens=4)
    report.timings = {"prompt_n": 20, "prompt_ms": 10.0, "draft_n": 40, "draft_n_accepted": 30}
    m = remote_turn_metrics(t_submit_ns=0, arrival_times_ns=[5_000_000, 6_000_000], report=report, stop_reason="stop")
    assert (m.spec_mode, m.spec_drafted, m.spec_accepted, m.spec_acceptance) == ("draft", 40, 30, 0.75)
    assert m.spec_steps is None and m.spec_speedup is None  # not reported: unknown
    report.timings = {"prompt_n": 20, "prompt_ms": 10.0}
    plain = remote_turn_metrics(t_submit_ns=0, arrival_times_ns=[5_000_000], report=report, stop_reason="stop")
    assert plain.spec_mode is None and plain.spec_drafted is None


def test_a_model_served_by_its_path_is_named_by_its_file_and_its_quant_read_from_it():
    """llama-server without --alias serves a model by its whole path: the name is the file's name (not a
    path over three lines), the quantisation comes from it; a served id without one stays unknown."""
    path = "/home/someone/models/unsloth/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q4_K_M.gguf"
    models = {"object": "list", "data": [{"id": path, "object": "model", "meta": MODELS["data"][0]["meta"]}]}
    routes = {"GET /v1/models": (200, models), "GET /props": (200, PROPS | {"model_path": path})}
    with ScriptedServer(routes) as srv:
        info = _loaded(srv.url).loaded.info
    assert (info.name, info.quantization, info.path) == ("Qwen3-0.6B-Q4_K_M.gguf", "Q4_K_M", path)
    with ScriptedServer({"GET /v1/models": (200, MODELS), "GET /props": (200, PROPS)}) as srv:
        info = _loaded(srv.url).loaded.info  # "tiny", from /srv/tiny.gguf: no quant in either name
    assert (info.name, info.quantization) == ("tiny", "unknown")
