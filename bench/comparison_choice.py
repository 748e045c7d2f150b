"""python bench/comparison_choice.py RUN [RUN ...] [--run tuned-kair]

How a student does on the dev questions that name their answer: "Which film came out first, A or
B?", "Who is older, A or B?". A question counts when it holds " or " and its gold answer (not
yes/no) occurs in its own normalised text. Per run and dev set: how many such questions, how often
the student answers the gold option, the other option named in the question (its answer occurs
in the question but is not gold) or something else, how often it names the option that comes
first in the question against how often gold comes first, and its F1 on these questions and on
the rest. Two options make 50% the rate of a coin. `stated`: how many of these questions' final
index holds an outcome relation (silver's `outcomes` form, "B -> is older rather than -> A"), and
of those how many name gold as the winner. `both`: how many final indexes hold relations about two
or more entities the question names (about both options, where a comparison needs a fact on each
side); a student that stops after one side cannot compare. Reads RUN/traces/<dataset>/<run>.jsonl
of `kair demo` or `kair eval` run folders.
"""

from __future__ import annotations

from answer_reach import mean, traces_per_set

from eval.metrics import normalize_answer, score_trace


def named_gold(question: str, golds: list[str]) -> str | None:
    """The gold answer the question names among its options, or None when it names none."""
    q = f" {normalize_answer(question)} "
    if " or " not in q:
        return None
    for g in golds:
        ng = normalize_answer(g)
        if ng and ng not in ("yes", "no") and f" {ng} " in q:
            return ng
    return None


def main() -> None:
    print(f"{'run':34s} {'dataset':16s} {'named':>5s} {'gold':>4s} {'other':>5s} {'else':>4s} "
          f"{'picks 1st':>9s} {'gold 1st':>8s} {'stated':>6s} {'gold':>4s} {'both':>4s} {'F1 named':>8s} "
          f"{'F1 rest':>7s}")
    for root, dataset, traces in traces_per_set():
        gold_hits = other = elsewhere = picks_first = gold_first = stated = stated_gold = both = 0
        f1_named, f1_rest = [], []
        for t in traces:
            f1 = 100 * score_trace(t).scores["f1"]
            gold = named_gold(t.question.question, t.question.answers)
            if gold is None:
                f1_rest.append(f1)
                continue
            f1_named.append(f1)
            q = f" {normalize_answer(t.question.question)} "
            answer = normalize_answer(t.answer or "")
            gold_at = q.index(f" {gold} ")
            answer_at = q.find(f" {answer} ") if answer else -1
            if answer == gold:
                gold_hits += 1
            elif answer_at >= 0:
                other += 1
            else:
                elsewhere += 1
            if answer == gold or answer_at >= 0:
                picks_first += first_option(q, gold_at if answer == gold else answer_at)
            gold_first += first_option(q, gold_at)
            relations = t.final_index.relations if t.final_index else []
            winners = [normalize_answer(h) for h, r, _ in relations if r.endswith(" rather than")]
            both += len(named_entities(q, relations)) >= 2
            stated += bool(winners)
            stated_gold += gold in winners
        print(f"{root:34s} {dataset:16s} {len(f1_named):5d} {gold_hits:4d} {other:5d} {elsewhere:4d} "
              f"{picks_first:9d} {gold_first:8d} {stated:6d} {stated_gold:4d} {both:4d} {mean(f1_named):>8s} "
              f"{mean(f1_rest):>7s}")


def named_entities(q: str, relations: list) -> set[str]:
    """The relations' heads and tails that the normalised question `q` names as a phrase."""
    names = {normalize_answer(e) for h, _, t in relations for e in (h, t)}
    return {n for n in names if n and f" {n} " in q}


def first_option(q: str, at: int) -> bool:
    """Text starting at `at` is the first option when the question's " or " comes after it."""
    return q.find(" or ", at) >= 0


if __name__ == "__main__":
    main()
