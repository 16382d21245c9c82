"""The TTFT prediction before a chat's first turn (chatphase.chat.ttft_prior): earlier chats' turns of the same model
file on this machine (the history database), else the saved bench sweep, else the roofline's least TTFT when this
machine's matmul peak is known and bounds the weights, else nothing — each source in that order."""

from __future__ import annotations

import math
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pytest
from fake_engine import fake_model_info
from session_support import SETTINGS, Streamed

from chatphase.chat import ttft_prior
from chatphase.chat.budget import budget_of
from chatphase.engine.config import EngineConfig
from chatphase.engine.events import PromptCount
from chatphase.engine.metrics import TurnMetrics, compute_turn_metrics
from chatphase.history import ttft_prior as history_ttft
from chatphase.history.context import model_hash
from chatphase.history.db import connect, db_path
from chatphase.history.index import catch_up
from chatphase.models.roofline import prefill_flops
from chatphase.sessions.writer import SessionWriter
from chatphase.system import machine_peaks
from chatphase.timing.stats import t95
from chatphase.timing.ttft_model import PrefillPoint, fit
from chatphase.timing.ttft_prediction import TtftBound, TtftPredictor

HERE = {"machine": "box", "cpu": "AMD EPYC 9454"}
COUNT = PromptCount(prompt_tokens=1000, cached_tokens=0, kv_cache_tokens=0, n_ctx=4096)


def turn_metrics(n: int, depth: int, a_ms: float, b_ms: float, stop: str = "stop") -> TurnMetrics:
    """A turn of ``n`` tokens on ``depth`` cached ones: prefill ``b_ms`` a token, ``a_ms`` before it."""
    t0 = 1_000_000_000
    start, prefill_ns = t0 + round(a_ms * 1e6), round(b_ms * n * 1e6)
    return compute_turn_metrics(
        t_submit_ns=t0,
        t_prefill_start_ns=start,
        t_prefill_end_ns=start + prefill_ns,
        token_times_ns=[start + prefill_ns + i * 10_000_000 for i in range(4)],
        prompt_tokens=depth + n,
        cached_tokens=depth,
        kv_cache_tokens=depth + n + 4,
        kv_bytes_per_token=1000,
        kv_capacity_bytes=4096 * 1000,
        stop_reason=stop,  # type: ignore[arg-type]
        prefill_ns=prefill_ns,
    )


def write_chat(
    model_path: Path, digest: str | None, machine: dict, turns: list[TurnMetrics], engine: dict | None = None
) -> None:
    """One saved chat of ``turns`` on the model file ``model_path`` (content hash ``digest``) on ``machine``, with
    the engine settings ``engine`` recorded (default: n_ctx alone, as an older file's context)."""
    model = {"name": model_path.stem, "architecture": "llama", "quantization": "Q4_1", "path": str(model_path)}
    w = SessionWriter.create(model=model, settings=SETTINGS)
    w.set_context({"model_hash": digest, "backend": "llama.cpp", "engine": engine or {"n_ctx": 4096}, **machine})
    for i, m in enumerate(turns):
        w.begin_turn(f"message {i}", {"temperature": 0.0}, Streamed())
        w.finish_turn("reply", m)
    w.close()


@pytest.fixture
def model_file(tmp_path) -> Path:
    path = tmp_path / "smol.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    return path


@pytest.fixture
def here(monkeypatch):
    monkeypatch.setattr(history_ttft, "machine_identity", lambda: dict(HERE))
    monkeypatch.setattr(machine_peaks, "machine_identity", lambda: dict(HERE))


def index_all() -> None:
    conn = connect()
    catch_up(conn)
    conn.close()


def test_the_history_prior_takes_this_model_files_turns_on_this_machine_only(tmp_path, model_file, here):
    digest = model_hash(model_file)
    assert digest is not None
    mine = [turn_metrics(n, d, 40.0, 2.0) for n, d in ((30, 0), (200, 40), (600, 300))]
    write_chat(model_file, digest, HERE, mine)
    write_chat(model_file, digest, {"machine": "box", "cpu": "Intel Xeon 8480"}, [turn_metrics(500, 0, 1.0, 90.0)])
    write_chat(model_file, digest, {"machine": "laptop", "cpu": HERE["cpu"]}, [turn_metrics(500, 0, 1.0, 90.0)])
    same_name = tmp_path / "elsewhere" / "smol.gguf"  # another file of the same name: another hash
    write_chat(same_name, "ffffffffffffffff", HERE, [turn_metrics(500, 0, 1.0, 90.0)])
    index_all()
    points = history_ttft.history_points(str(model_file))
    assert [(p.tokens, p.depth, p.origin) for p in points] == [(600, 300, "earlier chats"), (200, 40, "earlier chats"),
                                                                (30, 0, "earlier chats")]  # fmt: skip
    prior = fit(points, 0.0)
    assert prior is not None and prior.source == "earlier chats, 3 turns"
    assert prior.a_ms == pytest.approx(40.0, abs=0.01) and prior.b_ms_per_token == pytest.approx(2.0)
    assert history_ttft.history_points(str(tmp_path / "missing.gguf")) == []  # no file, no identity


def test_a_turn_stopped_after_its_prefill_is_a_point_and_one_stopped_during_it_is_not(model_file, here):
    """Seen: a full prefill stopped with Esc during decode was never fitted. Its prefill completed (a first token
    came); one stopped during the prefill (no TTFT) or a failed one is no point. A restore comes with its figures."""
    digest = model_hash(model_file)
    stopped = turn_metrics(800, 0, 1.0, 9.0, stop="cancelled")
    in_prefill = replace(turn_metrics(500, 0, 1.0, 9.0, stop="cancelled"), ttft_ms=None)
    failed = turn_metrics(700, 0, 1.0, 9.0, stop="error")
    restored = replace(turn_metrics(20, 2000, 30.0, 2.0), restored_tokens=2000, restore_ms=25.0)
    write_chat(model_file, digest, HERE, [stopped, in_prefill, failed, restored])
    index_all()
    points = history_ttft.history_points(str(model_file))
    assert sorted((p.tokens, p.restored_tokens, p.restore_ms) for p in points) == [(20, 2000, 25.0), (800, 0, 0.0)]


def test_the_history_prior_keeps_the_newest_turns(model_file, here):
    digest = model_hash(model_file)
    assert digest is not None
    write_chat(model_file, digest, HERE, [turn_metrics(100, 0, 1.0, 9.0) for _ in range(3)])  # an older build
    time.sleep(1.1)  # turns start a second apart
    write_chat(model_file, digest, HERE, [turn_metrics(100, 0, 1.0, 3.0) for _ in range(2)])
    index_all()
    conn = connect()
    points = history_ttft.recent_points(conn, digest, HERE["machine"], HERE["cpu"], limit=2)
    conn.close()
    assert [p.prefill_ms for p in points] == [pytest.approx(300.0)] * 2


def test_the_history_prior_takes_the_turns_of_the_same_prefill_settings(model_file, here):
    """Two prefill threads run at about half the rate of four, a GPU many times the CPU: turns of other settings
    would mislead. A context that did not record a setting (an older file) matches any value of it."""
    digest = model_hash(model_file)
    two = {"n_ctx": 4096, "n_threads_batch": 2, "n_gpu_layers": 0, "flash_attn": "on", "type_k": "f16"}
    write_chat(model_file, digest, HERE, [turn_metrics(n, 0, 10.0, 4.0) for n in (100, 300)], two)
    write_chat(model_file, digest, HERE, [turn_metrics(200, 0, 10.0, 2.0)], {**two, "n_threads_batch": 4})
    write_chat(model_file, digest, HERE, [turn_metrics(200, 0, 10.0, 0.1)], {**two, "n_gpu_layers": -1})
    write_chat(model_file, digest, HERE, [turn_metrics(200, 0, 10.0, 6.0)], {**two, "type_k": "q8_0"})
    write_chat(model_file, digest, HERE, [turn_metrics(500, 0, 10.0, 4.0)])  # settings not recorded
    index_all()
    prior = history_ttft.history_points(str(model_file), {**two, "n_batch": 999, "flash_attn": None})
    assert len(prior) == 3  # n_batch is not compared, None not
    assert all(p.prefill_ms == 4.0 * p.tokens for p in prior)
    four = history_ttft.history_points(str(model_file), {**two, "n_threads_batch": 4})
    assert len(four) == 2  # the 4-thread turn and the unrecorded one
    assert len(history_ttft.history_points(str(model_file))) == 6


def test_the_prior_is_taken_again_with_the_settings_the_load_resolved(model_file, here):
    """Before the load, flash attention ``auto`` is not compared; the loaded engine says ``on``, and the prior is
    then the turns run with it."""
    from chat_support import Calls
    from fake_engine import FakeEngine

    from chatphase.chat.controller import ChatController
    from chatphase.chat.dispatch import InlineDispatcher
    from chatphase.settings.schema import Settings

    digest = model_hash(model_file)
    on, off = ({"n_ctx": 4096, "n_gpu_layers": 0, "flash_attn": fa} for fa in ("on", "off"))
    write_chat(model_file, digest, HERE, [turn_metrics(n, 0, 50.0, 4.0) for n in (100, 300, 900)], on)
    write_chat(model_file, digest, HERE, [turn_metrics(n, 0, 50.0, 9.0) for n in (100, 300)], off)
    index_all()
    info = fake_model_info(path=str(model_file), attention=None)
    chat = ChatController(Settings(), info, lambda i, s: FakeEngine(i, s.engine), InlineDispatcher(), [Calls()])
    assert chat.settings.engine.flash_attn == "auto" and chat.ttft.model.source == "earlier chats, 5 turns"
    chat.start_engine()
    assert chat.loaded is not None and chat.loaded.settings.flash_attn == "on"
    assert chat.ttft.model.source == "earlier chats, 3 turns"
    assert budget_of(COUNT, chat.ttft).line().endswith("TTFT ≈ 4.0 s (3.9–4.3 s; earlier chats, 3 turns)")


def test_a_new_chat_takes_the_prior_again_with_the_turns_indexed_since(model_file, here):
    """Seen: "earlier chats, 21 turns" stayed after a new turn of the same run until a restart."""
    from chat_support import Calls
    from fake_engine import FakeEngine

    from chatphase.chat.controller import ChatController
    from chatphase.chat.dispatch import InlineDispatcher
    from chatphase.settings.schema import Settings

    digest = model_hash(model_file)
    on = {"n_ctx": 4096, "n_gpu_layers": 0, "flash_attn": "on"}
    write_chat(model_file, digest, HERE, [turn_metrics(n, 0, 50.0, 4.0) for n in (100, 300)], on)
    index_all()
    info = fake_model_info(path=str(model_file), attention=None)
    chat = ChatController(Settings(), info, lambda i, s: FakeEngine(i, s.engine), InlineDispatcher(), [Calls()])
    chat.start_engine()
    assert len(chat.ttft.prior) == 2
    write_chat(model_file, digest, HERE, [turn_metrics(200, 0, 50.0, 4.0)], on)  # a chat that ended meanwhile
    index_all()
    chat.new_chat()
    assert len(chat.ttft.prior) == 3


def test_a_turn_prefilled_on_fewer_threads_than_its_context_is_no_point(model_file, here):
    """Seen: with ``--threads auto`` on a busy machine a 1,516-token turn was prefilled on 1 of its context's 2
    threads (23.9 s); in a quiet run later the budget line said ``TTFT ≥ 23.9 s`` for 2,772 tokens, which took 19.8 s
    on 2. Such a turn is left out where the prefill threads are compared; a turn that did not record them matches."""
    digest = model_hash(model_file)
    two = {"n_ctx": 4096, "n_threads_batch": 2, "n_gpu_layers": 0}
    full = [replace(turn_metrics(n, 0, 10.0, 4.0), n_threads_prefill=2) for n in (100, 300)]
    busy = replace(turn_metrics(1500, 0, 10.0, 15.0), n_threads_prefill=1)
    write_chat(model_file, digest, HERE, [*full, busy, turn_metrics(200, 0, 10.0, 4.0)], two)
    index_all()
    prior = history_ttft.history_points(str(model_file), two)
    assert sorted(p.tokens for p in prior) == [100, 200, 300]
    assert len(history_ttft.history_points(str(model_file))) == 4  # threads not compared: every turn


def test_earlier_chats_predictions_shown_and_missed_widen_the_first_range_of_a_new_run(model_file, here):
    """``ask`` is one turn a process: the errors of the estimates made in earlier runs (``ttft_estimate_ms``, or
    ``ttft_predicted_ms`` in a file from before it; indexed with their turns) bound its range from below as a chat's
    own do; turns without one add none."""
    digest = model_hash(model_file)
    sizes = (100, 300, 200, 400, 150)
    steady = [turn_metrics(n, 0, 50.0, 4.0) for n in sizes]
    write_chat(model_file, digest, HERE, steady)
    index_all()
    plain = ttft_prior.ttft_predictor(fake_model_info(path=str(model_file), attention=None), EngineConfig())
    assert plain.forward_half == 0.0 and all(p.predicted_ms is None for p in plain.prior)
    missed = [  # a withheld prediction's estimate (ttft_estimate_ms), or a shown one in a file from before that field
        replace(turn_metrics(n, 0, 50.0, 4.1), **{key: 0.9 * (50.0 + 4.1 * n)})
        for n, key in zip(sizes, ["ttft_estimate_ms", "ttft_predicted_ms"] * 3, strict=False)
    ]
    write_chat(model_file, digest, HERE, missed)  # predicted 10 % low, each
    index_all()
    told = ttft_prior.ttft_predictor(fake_model_info(path=str(model_file), attention=None), EngineConfig())
    wanted = sorted(m.ttft_estimate_ms or m.ttft_predicted_ms for m in missed)
    assert sorted(p.predicted_ms for p in told.prior if p.predicted_ms) == wanted
    assert told.forward_half == pytest.approx(t95(5) * math.log(1 / 0.9), rel=0.02)
    first = budget_of(PromptCount(prompt_tokens=300, cached_tokens=0, kv_cache_tokens=0, n_ctx=4096), told).prediction
    assert first is not None and first.ttft_ms is not None and first.high_ms is not None
    assert math.log(first.high_ms / first.ttft_ms) >= told.forward_half - 1e-9


def test_no_database_or_an_unreadable_one_gives_no_prior(model_file, here):
    assert not db_path().exists()
    assert history_ttft.history_points(str(model_file)) == []
    assert not db_path().exists()  # reading a prior creates no database
    db_path().parent.mkdir(parents=True, exist_ok=True)
    db_path().write_bytes(b"not a database" * 100)
    assert history_ttft.history_points(str(model_file)) == []


def test_a_chat_on_a_model_with_history_predicts_its_first_turn_from_earlier_chats(model_file, here):
    from chat_support import Calls
    from fake_engine import FakeEngine

    from chatphase.chat.controller import ChatController
    from chatphase.chat.dispatch import InlineDispatcher
    from chatphase.settings.schema import Settings

    digest = model_hash(model_file)
    write_chat(model_file, digest, HERE, [turn_metrics(n, 0, 50.0, 4.0) for n in (100, 300, 900)])
    index_all()
    info = fake_model_info(path=str(model_file), attention=None)
    chat = ChatController(Settings(), info, lambda i, s: FakeEngine(i, s.engine), InlineDispatcher(), [Calls()])
    line = budget_of(COUNT, chat.ttft).line()
    assert line.endswith("TTFT ≈ 4.0 s (3.9–4.3 s; earlier chats, 3 turns)")  # 50 ms + 1,000 × 4 ms


def fake_sources(monkeypatch, history: bool, sweep: bool, peak: bool) -> None:
    """Each source of the prior present or not, faked."""
    hist = [PrefillPoint(n, 0, float(n), float(n), origin="earlier chats") for n in (100, 400, 900)]  # 1 ms a token
    bench = [PrefillPoint(n, 0, float(n), float(n), origin="bench results smol.json") for n in (200, 800)]
    monkeypatch.setattr(ttft_prior, "history_points", lambda path, settings: hist if history else [])
    monkeypatch.setattr(ttft_prior, "saved_points", lambda path, folder: bench if sweep else [])
    found = machine_peaks.FlopsPeak(1e11, 2, "numpy.matmul float32", "2026-12-04T08:00:00+00:00")
    monkeypatch.setattr(ttft_prior, "flops_peak", lambda threads: found if peak and threads <= 2 else None)


F32 = fake_model_info(quantization="ALL_F32", n_vocab=49_152, n_embd=576)
TWO_THREADS = EngineConfig(n_threads=2, n_threads_batch=2)


@pytest.mark.parametrize(
    ("history", "sweep", "peak", "says", "then"),
    [
        (True, True, True, "TTFT ≈ 1.0 s (952 ms–1.0 s; earlier chats + bench results smol.json, 5 prefills)",
         "TTFT ≈ 1.0 s (952 ms–1.0 s; this chat + earlier chats + bench results smol.json, 6 prefills)"),
        (False, True, True, "TTFT ≈ 1.0 s (952 ms–1.1 s; bench results smol.json, 2 prefills)",
         "TTFT ≈ 1.0 s (952 ms–1.1 s; this chat + bench results smol.json, 3 prefills)"),
        (False, False, True, "TTFT ≥ 2.1 s (roofline)", "TTFT ≥ 2.1 s (not enough turns yet: 1)"),
        (False, False, False, "TTFT: not enough turns yet (0)", "TTFT ≥ 150 ms (not enough turns yet: 1)"),
    ],
)  # fmt: skip
def test_every_source_is_fitted_together_and_the_roofline_bounds_what_is_withheld(
    monkeypatch, history, sweep, peak, says, then
):
    fake_sources(monkeypatch, history, sweep, peak)
    predictor = ttft_prior.ttft_predictor(F32, TWO_THREADS)
    assert budget_of(COUNT, predictor).line().endswith(says)
    predictor.add(150, 0, 150.0, 150.0)  # the chat's own turn joins them
    assert budget_of(COUNT, predictor).line().endswith(then)


def test_the_roofline_bound_is_the_weight_matmuls_flops_at_the_peak_and_never_a_prediction(monkeypatch):
    fake_sources(monkeypatch, False, False, True)
    predictor = ttft_prior.ttft_predictor(F32, TWO_THREADS)
    assert predictor.model is None and predictor.predict(1000, 0).ttft_ms is None  # nor the prefill's time left
    bound = predictor.bound
    assert bound is not None
    matrix = 49_152 * 576  # tied: one matrix, the output of the last token only
    flops = 2 * (F32.n_params - matrix) * 1000 + 2 * matrix
    assert prefill_flops(F32, 1000) == flops and bound.ttft_ms(1000) == pytest.approx(1000 * flops / 1e11)
    untied = replace(F32, embedding_bytes=1)  # the input embedding is a lookup: both matrices out
    assert prefill_flops(untied, 1) == 2 * (F32.n_params - 2 * matrix) + 2 * matrix
    assert ttft_prior.ttft_predictor(F32, EngineConfig(n_threads=4, n_threads_batch=4)).bound is None  # 2-thread peak
    budget = budget_of(COUNT, TtftPredictor(0.0, (), TtftBound(1e11, 4e7, 0.0)))
    assert budget.ttft_ms is None and budget.line().endswith("TTFT ≥ 400 ms (roofline)")


def test_a_float32_peak_bounds_no_quantised_model(monkeypatch):
    fake_sources(monkeypatch, False, False, True)
    for quant in ("Q4_1", "Q8_0", "F16", "BF16"):  # int8 / 16-bit kernels run faster than a float32 peak
        assert ttft_prior.ttft_predictor(replace(F32, quantization=quant), TWO_THREADS).bound is None
    assert ttft_prior.ttft_predictor(replace(F32, n_vocab=0), TWO_THREADS).bound is None  # FLOPs unknown


def test_the_machine_peaks_file_keeps_each_machines_highest_peak_per_thread_count(tmp_path, here, monkeypatch):
    path = tmp_path / "peaks.json"
    assert machine_peaks.flops_peak(1, path) is None
    machine_peaks.record_flops(50e9, 2, "matmul", path)
    machine_peaks.record_flops(40e9, 2, "matmul under load", path)  # lower: not a better peak
    machine_peaks.record_flops(90e9, 4, "matmul", path)
    got = machine_peaks.flops_peak(2, path)
    assert got is not None and (got.flops_per_s, got.threads, got.method) == (50e9, 2, "matmul")
    one = machine_peaks.flops_peak(1, path)  # fewer threads: the 2-thread peak, a looser bound
    assert one is not None and one.threads == 2
    assert machine_peaks.flops_peak(8, path) is None  # more threads than measured: no bound
    monkeypatch.setattr(machine_peaks, "machine_identity", lambda: {"machine": "laptop", "cpu": "M3"})
    assert machine_peaks.flops_peak(2, path) is None  # another machine's peaks bound nothing here
    path.write_text("{broken")
    assert machine_peaks.flops_peak(2, path) is None


def test_a_quiet_peaks_measurement_is_recorded_and_one_beside_a_busy_engine_is_not(tmp_path, monkeypatch, here):
    from chatphase.bench.core import peaks
    from chatphase.system import engine_registry

    monkeypatch.setenv("CHATPHASE_CACHE_DIR", str(tmp_path))  # the run's cache is shared by its tests
    monkeypatch.setattr(engine_registry, "wait_until_quiet", lambda wait, exclude: (0.0, []))
    monkeypatch.setattr(engine_registry, "engine_cpu_s", lambda exclude: {})
    beside: list[int] = [4242]
    monkeypatch.setattr(engine_registry, "busy_engines", lambda before, dt, exclude: beside)
    fast = peaks.Repeated((1e9,), True)
    monkeypatch.setattr(peaks, "measure_read", lambda *a: (fast, "read", {"sum": 1e9}))
    monkeypatch.setattr(peaks, "measure_bandwidth", lambda *a: (fast, "copy"))
    monkeypatch.setattr(peaks, "measure_matmul_flops", lambda n, t, s: (peaks.Repeated((7e10,), True), "mm"))
    peaks.measure_peaks(threads=2)
    assert machine_peaks.flops_peak(2) is None
    beside.clear()
    peaks.measure_peaks(threads=2)
    got = machine_peaks.flops_peak(2)
    assert got is not None and (got.flops_per_s, got.method) == (7e10, "mm")


def test_the_history_prior_s_work_does_not_grow_with_the_history(model_file, here, monkeypatch):
    """At controller construction, on the UI thread, the prior reads the newest turns through the index and stops:
    counted in SQLite's own virtual-machine steps (the same on any machine, however fast or busy), its work on a
    10,000-turn history is that on a 1,000-turn one, not ten times it. (Its time: benchmarks/history_db.py.)"""
    digest = model_hash(model_file)
    write_chat(model_file, digest, HERE, [turn_metrics(100, 0, 1.0, 2.0)])
    index_all()
    conn = sqlite3.connect(db_path())
    ctx = conn.execute("SELECT id FROM contexts").fetchone()[0]
    conn.execute(
        "INSERT INTO contexts (key, model_hash, machine, cpu, backend) VALUES ('o', 'other', 'box', ?, 'llama.cpp')",
        (HERE["cpu"],),
    )
    other = conn.execute("SELECT id FROM contexts WHERE key = 'o'").fetchone()[0]
    rows = [
        (
            f"s{i // 20}",
            i % 20 + 2,
            f"2026-11-{1 + i % 28:02d}T10:00:00+00:00",
            ctx if i % 2 else other,
            "stop",
            100 + i % 700,
            i % 300,
            50.0,
            60.0,
        )
        for i in range(10_000)
    ]
    steps: list[int] = []
    real_connect = history_ttft.connect

    def counted(*args, **kwargs):
        db = real_connect(*args, **kwargs)
        steps.append(0)

        def step() -> int:
            steps[-1] += 1
            return 0

        db.set_progress_handler(step, 100)  # called every 100 SQLite VM instructions
        return db

    monkeypatch.setattr(history_ttft, "connect", counted)
    work = []
    for part in (rows[:1_000], rows[1_000:]):
        conn.executemany("INSERT OR IGNORE INTO sessions (id, path) VALUES (?, ?)", {(r[0], r[0]) for r in part})
        conn.executemany(
            "INSERT INTO turns (session_id, turn, started, context_id, stop_reason, prefill_tokens, cached_tokens, prefill_ms, ttft_ms, reply)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'a reply of some length ' || hex(randomblob(200)))",
            part,
        )
        conn.commit()
        points = history_ttft.history_points(str(model_file))
        assert len(points) == history_ttft.RECENT_TURNS
        work.append(steps[-1])
    conn.close()
    print(f"history prior: {work[0] * 100:,} SQLite steps on 1,000 turns, {work[1] * 100:,} on 10,000")
    assert work[1] <= 1.5 * work[0] + 10, work
