"""`silver`: gold-annotation trajectories with real retrieval, reproducible through the real loop."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from data_gen.filter import FilterConfig, run_filter
from data_gen.quality import summarize_quality
from data_gen.chains import GoldDocs, mentions, musique_chain
from data_gen.sft import SFTDataConfig, build_sft, check_recorded
from data_gen.silver import SilverConfig, run_silver, silver, silver_counts
from data_gen.store import DataSpec, closed_corpus, load_questions, read_trajectories
from eval.metrics import normalize_answer
from kair_runtime.config import LoopConfig, RetrieverConfig, RuntimeConfig
from kair_runtime.index import norm_key
from kair_runtime.llm.scripted import ScriptedLLM
from kair_runtime.llm.base import Completion
from kair_runtime.loop import STEP, KairLoop, extract_answer
from kair_runtime.prompts import PromptSet

N = 15
SPECS = [DataSpec("hotpotqa", limit=N), DataSpec("musique", limit=N), DataSpec("2wikimultihopqa", split="dev", limit=N)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, shared_data):
    from kair_runtime.retrieval import build_retriever

    root = tmp_path_factory.mktemp("silver")
    corpus = closed_corpus(SPECS, [], root / "corpus.jsonl")
    retriever = build_retriever(RetrieverConfig(kind="bm25", corpus=str(corpus)))
    return root, corpus, retriever


def run(setup, fmt="kr", max_steps=4, specs=SPECS, name=None, outcomes=False):
    root, corpus, retriever = setup
    cfg = SilverConfig(runtime=RuntimeConfig(loop=LoopConfig(index_format=fmt, max_steps=max_steps, top_k=5)),
                       datasets=[dataclasses.replace(s) for s in specs], corpus=str(corpus),
                       out_dir=str(root / (name or f"{fmt}-{max_steps}")), outcomes=outcomes)
    path, traces = silver(cfg, retriever=retriever)
    return cfg, traces


@pytest.fixture(scope="module")
def kr(setup):
    return run(setup)


def test_silver_trajectories_per_benchmark(kr):
    cfg, traces = kr
    counts = silver_counts(traces)
    assert set(counts) == {"hotpotqa", "musique", "2wikimultihopqa"}
    assert all(c["total"] == N and c["complete"] >= N // 2 for c in counts.values()), counts
    assert len(read_trajectories(cfg.out_dir)) == 3 * N
    stats = json.loads((Path(cfg.out_dir) / "stats.json").read_text())  # the printed counts, recorded
    assert stats == {"datasets": counts, "trajectories": 3 * N}
    for t in traces:
        assert t.extra["teacher"] == "annotations" and t.error is None
        # The gold answer, read back as the loop reads an answer ("U.S." -> "U.S").
        assert t.final_output == t.question.answers[0] and t.answer == extract_answer(t.question.answers[0])
        assert all(s.parsed_ok and s.retrieved and not s.fallbacks for s in t.steps)
        if t.extra["complete"]:
            assert t.stop_reason == "sufficient" and t.steps[-1].judgment == "sufficient"
            assert all(s.judgment == "insufficient" and s.next_query for s in t.steps[:-1])
        else:
            assert t.stop_reason == "max_steps" and len(t.steps) == 4
            assert all(s.judgment == "insufficient" for s in t.steps)


def test_the_loop_replaying_silver_outputs_reproduces_every_step(kr, setup):
    cfg, traces = kr
    _, _, retriever = setup
    prompts = PromptSet.load("kr")
    outputs = {}
    for t in traces:
        assert check_recorded(t, prompts, "answer") == []
        outputs[t.question.question] = [s.raw_output for s in t.steps] + [t.final_output]
    calls = {q: 0 for q in outputs}

    def respond(messages):
        q = re.search(r"^Question: (.*)$", messages[-1]["content"], re.MULTILINE).group(1)
        calls[q] += 1
        return outputs[q][calls[q] - 1]

    # The replay answers by call order, not by prompt: an incomplete chain repeats a prompt, and
    # the loop must ask again rather than reuse (silver's oracle, state-aware, always is asked).
    loop = KairLoop(ScriptedLLM(respond), retriever, dataclasses.replace(cfg.runtime.loop, reuse_repeated_steps=False))
    replayed = loop.run([t.question for t in traces])
    for t, r in zip(traces, replayed):
        assert [(s.query, [p.id for p in s.retrieved], s.prompt, s.index, s.reasoning, s.judgment, s.next_query)
                for s in r.steps] == \
               [(s.query, [p.id for p in s.retrieved], s.prompt, s.index, s.reasoning, s.judgment, s.next_query)
                for s in t.steps]
        assert (r.final_prompt, r.answer, r.stop_reason) == (t.final_prompt, t.answer, t.stop_reason)


class Replay:
    """A state-aware LLM that answers each question, by id, with its recorded outputs in order."""

    name = "replay"

    def __init__(self, traces):
        self.outputs = {t.question.id: [s.raw_output for s in t.steps] + [t.final_output] for t in traces}

    def generate_for(self, kind, states, prompts, sampling):
        return [Completion(self.outputs[s.trace.question.id][len(s.trace.steps) if kind == STEP else -1])
                for s in states]


@pytest.mark.parametrize("fmt", ["kr", "facts"])
def test_a_silver_trajectory_is_the_loops_record_of_its_outputs(setup, fmt):
    """Whole records, byte for byte: what KairLoop writes when a model gives silver's outputs is
    silver's trajectory (extra aside: silver writes its own keys; times and tokens are 0)."""
    cfg, traces = run(setup, fmt=fmt, name=f"replay-{fmt}")
    _, _, retriever = setup
    assert len({t.question.id for t in traces}) == len(traces)
    replayed = KairLoop(Replay(traces), retriever, cfg.runtime.loop).run([t.question for t in traces])
    assert sum(len(t.steps) for t in traces) > len(traces)  # multi-step chains were replayed
    for t, r in zip(traces, replayed):
        assert r.extra.pop("prompt_version") == t.extra["prompt_version"]
        r.extra, r.wall_time_s = t.extra, 0.0
        for s in r.steps:
            s.wall_time_s = 0.0
        assert r.to_json() == t.to_json()


def test_outcomes_add_an_a_or_b_answer_to_the_final_index_and_nothing_else(setup, kr):
    _, plain = kr
    cfg, traces = run(setup, name="outcomes", outcomes=True)
    prompts = PromptSet.load("kr")
    counted = silver_counts(traces)
    stated = [t for t in traces if "outcome" in t.extra]
    assert len(stated) >= 3 and counted["2wikimultihopqa"]["outcomes"] >= 3  # 2Wiki dev's "A or B?" questions
    assert sum(c.get("outcomes", 0) for c in counted.values()) == len(stated)
    for t, p in zip(traces, plain, strict=True):
        assert check_recorded(t, prompts, "answer") == []
        assert (t.question.id, t.answer, t.stop_reason, len(t.steps)) == (p.question.id, p.answer, p.stop_reason, len(p.steps))
        # every step but a complete chain's last is the plain one
        last = len(t.steps) - 1 if "outcome" in t.extra and t.extra["complete"] else len(t.steps)
        assert [s.raw_output for s in t.steps[:last]] == [s.raw_output for s in p.steps[:last]]
        if last == len(t.steps):
            continue
        answer, said, other = t.extra["outcome"]
        assert normalize_answer(answer) in {normalize_answer(a) for a in t.question.answers}
        assert said.endswith(" rather than") and mentions(t.question.question, other)
        assert t.final_index.relations == p.final_index.relations + [[answer, said, other]]


def test_index_holds_only_what_retrieved_documents_support(kr):
    _, traces = kr
    for t in (t for t in traces if t.question.dataset == "2wikimultihopqa"):
        gold = {tuple(norm_key(x) for x in ev) for ev in t.question.metadata["evidences"]}
        seen_titles, seen_text = set(), ""
        for s in t.steps:
            seen_titles |= {norm_key(p.title) for p in s.retrieved}
            seen_text += " " + normalize_answer(" ".join(p.title + " " + p.text for p in s.retrieved))
            for h, r, o in s.index.relations:
                assert (norm_key(h), norm_key(r), norm_key(o)) in gold
                assert norm_key(h) in {k.split(" (")[0] for k in seen_titles} | seen_titles \
                    or normalize_answer(o) in seen_text
        if t.extra["complete"]:
            assert len(t.steps[-1].index.relations) == len(gold)


def test_musique_queries_follow_the_decomposition_with_references_filled(kr, setup):
    _, traces = kr
    _, corpus, _ = setup
    for t in (t for t in traces if t.question.dataset == "musique"):
        assert t.steps[0].query == t.question.question
        assert not any(re.search(r"#\d", s.query) for s in t.steps)
    questions = {q.id: q for q in load_questions([DataSpec("musique", limit=2)])}
    gold = GoldDocs(corpus)
    first, second = (musique_chain(q, gold) for q in questions.values())
    assert [h.queries[0] for h in first] == ["What company published Journal of Psychotherapy Integration?",
                                             "Who was the first president of American Psychological Association?"]
    assert first[1].triples == [["American Psychological Association", "first president", "G. Stanley Hall"]]
    assert all(len(h.doc_ids) == 1 for h in first)
    # The KB form "Hello Love >> performer", then "#1" replaced by its answer.
    assert second[0].queries[0] == "performer of Hello Love" and second[0].triples == [["Hello Love", "performer", "Hank Snow"]]
    assert "Hank Snow" in second[1].queries[0] and "Tennessee" in second[2].queries[0]


@pytest.mark.parametrize("fmt", ["facts", "keywords", "kf", "text", "none"])
def test_every_index_format(setup, fmt):
    cfg, traces = run(setup, fmt=fmt, specs=[DataSpec("hotpotqa", limit=5), DataSpec("2wikimultihopqa", "dev", limit=5)])
    prompts = PromptSet.load(fmt)
    for t in traces:
        assert t.index_format == fmt and check_recorded(t, prompts, "answer") == []
        assert all(not s.fallbacks for s in t.steps)
        assert fmt == "none" or not t.final_index.is_empty()
    if fmt in ("facts", "text"):  # built from the supporting sentences
        t = next(t for t in traces if t.extra["complete"])
        text = t.final_index.summary if fmt == "text" else " ".join(t.final_index.facts)
        assert any(normalize_answer(s["text"]) in normalize_answer(text)
                   for s in t.question.metadata["supporting_sentences"])


def test_incomplete_chains_are_kept_marked_and_filtered_out(setup, tmp_path):
    cfg, traces = run(setup, max_steps=1, specs=[DataSpec("musique", limit=N)], name="one-step")
    incomplete = [t for t in traces if not t.extra["complete"]]
    assert len(traces) == N and len(incomplete) >= N // 2  # multi-hop evidence needs more than one search
    assert all(t.answer and len(t.steps) == 1 for t in incomplete)
    report = run_filter(FilterConfig(trajectories=cfg.out_dir, out_dir=str(tmp_path / "f")))
    assert report["reasons"]["incomplete_evidence"] == len(incomplete) and report["kept"] == N - len(incomplete)


def test_silver_quality_and_sft(kr, tmp_path):
    cfg, traces = kr
    rows = {r["dataset"]: r for r in summarize_quality(traces)}
    assert rows["2wikimultihopqa"]["triple_recall"] >= 0.9 and rows["2wikimultihopqa"]["entity_recall"] >= 0.9
    assert rows["hotpotqa"]["triple_recall"] is None  # no gold triples
    assert all(r["entity_recall"] >= 0.8 and r["mean_answer_step"] >= 1 for r in rows.values())
    run_filter(FilterConfig(trajectories=cfg.out_dir, out_dir=str(tmp_path / "kept")))
    stats = build_sft(SFTDataConfig(runtime=cfg.runtime, trajectories=str(tmp_path / "kept"),
                                    out_dir=str(tmp_path / "sft")))
    assert stats["sources"] == {"annotations": sum(1 for t in traces if t.extra["complete"])}
    assert not stats["skipped_not_reproducible"]
    structured_bounds_leave_room_for_every_reply(stats["loop_bounds"], tmp_path / "sft" / "train.jsonl")


def structured_bounds_leave_room_for_every_reply(bounds: dict[str, int], train_file: Path) -> None:
    """Under the recorded loop bounds the grammar refuses a training reply only where it refuses
    it under bounds far above any reply (a character it cannot spell), never for its length."""
    xgr = pytest.importorskip("xgrammar", reason="the structured extra")
    from kair_runtime.grammar import answer_grammar, step_grammar
    from kair_runtime.loop import KairLoop

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo(["<eos>"], stop_token_ids=[0]))
    rows = [json.loads(line) for line in train_file.open()]

    def accepted(b: dict[str, int]) -> list[bool]:
        bounds = KairLoop.grammar_bounds(LoopConfig(**b))
        grammars = {"step": compiler.compile_grammar(step_grammar("kr", bounds)),
                    "answer": compiler.compile_grammar(answer_grammar(bounds))}
        out = []
        for r in rows:
            matcher = xgr.GrammarMatcher(grammars["answer" if r["kind"] == "answer" else "step"],
                                         terminate_without_stop_token=True)
            out.append(matcher.accept_string(r["messages"][-1]["content"]) and matcher.is_completed())
        return out

    at_bounds = accepted(bounds)
    assert at_bounds == accepted({k: 2 * v for k, v in bounds.items()})
    assert sum(at_bounds) >= 0.8 * len(rows)


def test_a_question_without_a_chain_stays_out_of_the_loop_and_in_its_place(setup):
    _, corpus, retriever = setup
    qs = load_questions([DataSpec("hotpotqa", limit=2)])
    bare = dataclasses.replace(qs[0], id="bare", metadata={})
    traces = run_silver([qs[0], bare, qs[1]], retriever, RuntimeConfig(loop=LoopConfig(max_steps=2)), corpus)
    assert [t.question.id for t in traces] == [qs[0].id, "bare", qs[1].id]
    t = traces[1]
    assert (t.steps, t.stop_reason, t.error, t.final_prompt) == ([], "error", t.extra["note"], [])
    assert list(t.extra)[-3:] == ["note", "complete", "supported_hops"] and not t.extra["complete"]
    assert all(t.steps and t.error is None for t in (traces[0], traces[2]))


def test_an_oracle_failure_is_raised_not_recorded(setup, monkeypatch):
    import data_gen.silver as silver_module

    def broken(*args):
        raise KeyError("no such hop")
    monkeypatch.setattr(silver_module, "anchors", broken)
    _, corpus, retriever = setup
    with pytest.raises(KeyError, match="no such hop"):
        run_silver(load_questions([DataSpec("hotpotqa", limit=2)]), retriever, RuntimeConfig(), corpus)


def test_with_an_index_dir_gold_maps_into_the_index_and_no_corpus_is_built(setup, kr, tmp_path):
    # runtime.retriever_config_over's rule: the index's passages.jsonl is where retrieved ids come
    # from, so the gold paragraphs are looked up there (not in a closed corpus built for nothing).
    from typer.testing import CliRunner

    from kair_runtime.retrieval.cli import index_app

    root, corpus, _ = setup
    res = CliRunner().invoke(index_app, ["build", "--corpus", str(corpus), "--out", str(tmp_path / "index"),
                                         "--retriever", "bm25"])
    assert res.exit_code == 0, res.output
    cfg = SilverConfig(runtime=RuntimeConfig(retriever=RetrieverConfig(kind="bm25", index_dir=str(tmp_path / "index")),
                                             loop=LoopConfig(index_format="kr", max_steps=4, top_k=5)),
                       datasets=[dataclasses.replace(s) for s in SPECS], out_dir=str(tmp_path / "out"))
    _, traces = silver(cfg)
    assert not (tmp_path / "out" / "corpus.jsonl").exists()
    # The index holds the same passages under the same ids: the same trajectories as over the corpus.
    assert [(t.final_output, t.extra["complete"], [[p.id for p in s.retrieved] for s in t.steps]) for t in traces] == \
           [(t.final_output, t.extra["complete"], [[p.id for p in s.retrieved] for s in t.steps]) for t in kr[1]]


def test_decoding_settings_do_not_change_silver(setup, kr):
    # A run config made for a model (structured decoding, the n-gram ban) also drives silver, whose
    # oracle decodes nothing: it must give the same trajectories, not refuse the oracle backend.
    root, corpus, retriever = setup
    _, plain = kr
    loop = LoopConfig(index_format="kr", max_steps=4, top_k=5, structured=True)
    cfg = SilverConfig(runtime=RuntimeConfig(loop=loop), datasets=[dataclasses.replace(s) for s in SPECS],
                       corpus=str(corpus), out_dir=str(root / "structured"))
    _, traces = silver(cfg, retriever=retriever)
    assert [t.to_dict()["steps"] for t in traces] == [t.to_dict()["steps"] for t in plain]
