"""A remote reply's decode_tokens has the local engine's definition: the token a server stopped on (its
end-of-generation token) is not counted, where the server is known to count it (llama-server, vLLM).

The llama-server stream is recorded from the vendored llama-server on the bundled SmolLM2 (``max_tokens``
20, temperature 0, "Hi there"): 10 content chunks, whose text its ``/tokenize`` counts as 10 tokens, and
``completion_tokens`` = ``predicted_n`` = 11 with ``finish_reason`` ``stop``; at ``max_tokens`` 5 it sends
5 chunks, 5 tokens and ``length``.
"""

from __future__ import annotations

import pytest
from remote_support import ScriptedServer, content_chunk, sse

from chatphase.engine.events import Message, ModelLoaded, SamplingParams, TurnFinished, TurnRequest
from chatphase.engine.remote.engine import RemoteEngine
from chatphase.engine.remote.wire import ServerReport

pytestmark = pytest.mark.timeout(60)

MODEL = "/srv/SmolLM2-135M-Instruct.Q4_1.gguf"
PROPS = {"default_generation_settings": {"n_ctx": 1024}, "total_slots": 1, "model_path": MODEL}
REPLY = ["Hello", " there", "!", " How", " can", " I", " assist", " you", " today", "?"]


def _timings(n: int) -> dict:
    return {"cache_n": 0, "prompt_n": 32, "prompt_ms": 267.708, "predicted_n": n, "predicted_ms": 91.688}


def _recorded(pieces: list[str], finish: str, n: int, *, usage: bool = True) -> list:
    """llama-server's stream: a role chunk, one chunk per piece, the finish chunk, then usage + timings."""
    end: dict = {"choices": [], "timings": _timings(n)}
    if usage:
        end["usage"] = {"completion_tokens": n, "prompt_tokens": 32, "total_tokens": 32 + n}
    return sse(
        {"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}]},
        *(content_chunk(p) for p in pieces),
        {"choices": [{"finish_reason": finish, "index": 0, "delta": {}}]},
        end,
        "[DONE]",
    )


def _turn(routes: dict) -> TurnFinished:
    with ScriptedServer(routes) as srv:
        engine = RemoteEngine(srv.url)
        assert isinstance(list(engine.load())[-1], ModelLoaded)
        request = TurnRequest(1, (Message("user", "Hi there"),), SamplingParams(max_tokens=20, temperature=0))
        done = list(engine.run_turn(request))[-1]
    assert isinstance(done, TurnFinished)
    return done


def _llama_server(stream: list) -> dict:
    models = {"data": [{"id": MODEL, "object": "model", "owned_by": "llamacpp"}]}
    return {"GET /v1/models": (200, models), "GET /props": (200, PROPS), "POST /v1/chat/completions": (200, stream)}


def test_llama_server_count_leaves_out_the_end_of_generation_token():
    done = _turn(_llama_server(_recorded(REPLY, "stop", 11)))
    m = done.metrics
    assert done.reply == "Hello there! How can I assist you today?"
    assert (m.decode_tokens, m.decode_tokens_source) == (10, "usage")  # the local engine's 10, not 11
    assert m.decode_tokens_per_s == pytest.approx(9 / (m.decode_ms / 1000))  # the rate uses the corrected count
    assert m.tpot_ms == pytest.approx(m.decode_ms / 9)
    assert done.server_timings["predicted_n"] == 11  # the server's own figure is kept as it sent it


def test_llama_server_timings_count_is_corrected_too():
    m = _turn(_llama_server(_recorded(REPLY, "stop", 11, usage=False))).metrics
    assert (m.decode_tokens, m.decode_tokens_source) == (10, "timings")


def test_a_reply_cut_at_max_tokens_keeps_the_servers_count():
    """``length``: every counted token produced text, so nothing is taken off."""
    m = _turn(_llama_server(_recorded(REPLY[:5], "length", 5))).metrics
    assert (m.decode_tokens, m.stop_reason) == (5, "length")


def _openai(stream: list, owned_by: str) -> dict:
    models = {"data": [{"id": "tiny", "object": "model", "owned_by": owned_by}]}
    return {"GET /v1/models": (200, models), "POST /v1/chat/completions": (200, stream)}


def _usage_stream(n: int) -> list:
    return sse(
        *(content_chunk(p) for p in REPLY),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 32, "completion_tokens": n}},
        "[DONE]",
    )


def test_vllm_count_leaves_out_its_eos_token():
    """vLLM's ``completion_tokens`` is its output token ids, the EOS token among them."""
    m = _turn(_openai(_usage_stream(11), "vllm")).metrics
    assert (m.decode_tokens, m.decode_tokens_source) == (10, "usage")


def test_a_server_not_known_to_count_its_stop_token_keeps_its_figure():
    m = _turn(_openai(_usage_stream(10), "library")).metrics  # Ollama's /v1 says owned_by "library"
    assert m.decode_tokens == 10


@pytest.mark.parametrize(
    ("counts", "finish", "expected"),
    [(True, "stop", 10), (True, "tool_calls", 10), (True, "length", 11), (True, None, 11), (False, "stop", 11)],
)
def test_decode_count_takes_off_the_stop_token_only_when_the_reply_stopped_on_it(counts, finish, expected):
    report = ServerReport(completion_tokens=11, finish_reason=finish, counts_stop_token=counts)
    assert report.decode_count() == (expected, "usage")
    tokenized = ServerReport(tokenized_completion_tokens=10, finish_reason=finish, counts_stop_token=counts)
    assert tokenized.decode_count() == (10, "tokenizer")  # the reply's text: never holds the stop token
