"""Chat templates for assistant-only loss, and the token checks that go with them.

TRL's `assistant_only_loss` trains only the tokens a chat template renders inside
`{% generation %}...{% endgeneration %}`. Qwen2.5-Instruct's and Llama-3.1-Instruct's own
templates have no such markers, so `chat_templates/` holds training templates for both (and for
SmolLM2-Instruct, the CPU demo's student) that put each assistant reply *and its end-of-turn token*
(`<|im_end|>` / `<|eot_id|>`) inside the markers.
A training template is only used after it is shown to render the same text as the model's own
template on the actual training conversations (the markers themselves render nothing), so the
student is trained on exactly the prompts the runtime will send it.

    template = resolve_training_template(tokenizer, "auto", conversations)
    eot_id = end_of_turn_id(tokenizer, template)
    ensure_distinct_pad(tokenizer, avoid={eot_id, tokenizer.eos_token_id})
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

TEMPLATE_DIR = Path(__file__).resolve().parent / "chat_templates"

# name -> training template file (with generation markers).
TRAINING_TEMPLATES: dict[str, Path] = {
    "qwen2.5": TEMPLATE_DIR / "qwen2.5.jinja",  # ChatML as Qwen2.5-Instruct renders it
    "llama3.1": TEMPLATE_DIR / "llama3.1.jinja",  # Llama-3.1-Instruct's header layout
    "smollm2": TEMPLATE_DIR / "smollm2.jinja",  # ChatML with SmolLM2's default system turn (the CPU student)
}

# Tokens that serve as padding in these families' vocabularies, in order of preference; a pad
# must never be an end-of-turn token (see ensure_distinct_pad).
PAD_CANDIDATES = ("<|finetune_right_pad_id|>", "<|endoftext|>", "<|pad|>", "<pad>")

# Conversations every candidate template must render identically, beside the real data: a
# system prompt or none, several turns, and whitespace the Llama template trims.
PROBE_CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Question: who wrote it?"},
     {"role": "assistant", "content": "<index>\nKeywords: A\n</index>"}],
    [{"role": "system", "content": " Answer briefly. "},
     {"role": "user", "content": "First question\n"},
     {"role": "assistant", "content": " first answer "},
     {"role": "user", "content": "Second question"},
     {"role": "assistant", "content": "second answer"}],
]


class TemplateError(ValueError):
    pass


def has_generation_markers(template: str | None) -> bool:
    return bool(template) and re.search(r"\{%-?\s*generation\s*-?%\}", template) is not None


def load_template(name_or_path: str) -> str:
    """A registered training template by name, or any .jinja file by path."""
    if name_or_path in TRAINING_TEMPLATES:
        return TRAINING_TEMPLATES[name_or_path].read_text(encoding="utf-8")
    path = Path(name_or_path)
    if path.suffix in (".jinja", ".j2") and path.is_file():
        return path.read_text(encoding="utf-8")
    raise TemplateError(f"training_chat_template: {name_or_path!r} is neither a registered template "
                        f"({', '.join(sorted(TRAINING_TEMPLATES))}), 'auto', 'model', nor a .jinja file")


def render(tokenizer, conversation: list[dict[str, Any]], template: str, **kwargs) -> str:
    return tokenizer.apply_chat_template(conversation, tokenize=False, chat_template=template, **kwargs)


def first_mismatch(tokenizer, reference: str, candidate: str,
                   conversations: list[list[dict[str, Any]]]) -> str | None:
    """None when `candidate` renders every conversation (and every prompt with the assistant turn
    opened) exactly as `reference` does; otherwise a description of the first difference."""
    for i, conv in enumerate(conversations):
        prompt_only = conv[:-1] if conv[-1]["role"] == "assistant" else conv
        for msgs, gen in ((conv, False), (prompt_only, True)):
            try:
                want = render(tokenizer, msgs, reference, add_generation_prompt=gen)
                got = render(tokenizer, msgs, candidate, add_generation_prompt=gen)
            except Exception as e:  # jinja errors of all kinds: the template cannot render this
                return f"conversation {i}: rendering failed: {e}"
            if want != got:
                at = next((k for k, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
                return (f"conversation {i} (add_generation_prompt={gen}) differs at character {at}: "
                        f"model template gives {want[max(0, at - 30):at + 30]!r}, "
                        f"training template gives {got[max(0, at - 30):at + 30]!r}")
    return None


def resolve_training_template(tokenizer, choice: str,
                              conversations: list[list[dict[str, Any]]]) -> str | None:
    """The chat template to train with, or None to keep the tokenizer's own.

    choice: "model" keeps the model's template as is; "auto" keeps it when it already has
    generation markers, else picks the registered template that renders `conversations` like the
    model's; a registered name or a .jinja path is used after the same check (when the model has
    a template at all). Raises TemplateError when nothing fits, naming what differed.
    """
    own = tokenizer.chat_template
    if isinstance(own, dict):  # named variants: the default one is what apply_chat_template uses
        own = own.get("default")
    convs = PROBE_CONVERSATIONS + list(conversations)
    if choice == "model" or (choice == "auto" and has_generation_markers(own)):
        if not has_generation_markers(own):
            raise TemplateError("training_chat_template=model, but the model's chat template has no "
                                "{% generation %} markers, so assistant_only_loss would have no tokens to train")
        return None
    if choice != "auto":
        template = load_template(choice)
        if own:
            diff = first_mismatch(tokenizer, own, template, convs)
            if diff:
                raise TemplateError(f"training_chat_template {choice!r} does not render like the model's "
                                    f"own template: {diff}")
        return template
    if not own:
        raise TemplateError("the tokenizer has no chat template; set training_chat_template to one of "
                            f"{sorted(TRAINING_TEMPLATES)} or a .jinja file")
    reasons = {}
    for name in TRAINING_TEMPLATES:
        template = load_template(name)
        reasons[name] = first_mismatch(tokenizer, own, template, convs)
        if reasons[name] is None:
            return template
    detail = "; ".join(f"{n}: {r}" for n, r in reasons.items())
    raise TemplateError("the model's chat template has no {% generation %} markers and no registered "
                        f"training template renders like it ({detail}). Write a .jinja template with the "
                        "markers and set training_chat_template to its path, or set assistant_only_loss: false")


def assistant_token_mask(tokenizer, conversation: list[dict[str, Any]], template: str | None = None):
    """(input_ids, mask) as TRL computes them: mask is 1 on tokens inside generation markers."""
    out = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True, chat_template=template)
    return list(out["input_ids"]), list(out["assistant_masks"])


def end_of_turn_id(tokenizer, template: str | None = None) -> int:
    """The token that closes an assistant turn under `template`: the last trained token of a
    rendered reply. It must be a special token, or the model would never learn to stop."""
    ids, mask = assistant_token_mask(tokenizer, PROBE_CONVERSATIONS[0], template)
    trained = [i for i, m in zip(ids, mask) if m]
    if not trained:
        raise TemplateError("the chat template marks no assistant tokens: check its {% generation %} markers")
    last = trained[-1]
    if last not in set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values()):
        raise TemplateError(f"the last trained token of an assistant reply is {tokenizer.decode([last])!r}, "
                            "not an end-of-turn special token: put the end-of-turn token inside "
                            "{% generation %}...{% endgeneration %}")
    return last


def ensure_distinct_pad(tokenizer, avoid: set[int | None]) -> str:
    """Make the pad token something other than every id in `avoid` (the end-of-turn and eos ids).

    A pad equal to the end-of-turn token is a classic SFT bug: collators that mask padding by
    token id also mask every real end-of-turn label, and the model never learns to stop. Only
    tokens already in the vocabulary are used, so the embeddings never need resizing.
    """
    avoid = {a for a in avoid if a is not None}
    if tokenizer.pad_token is not None and tokenizer.pad_token_id not in avoid:
        return tokenizer.pad_token
    vocab = tokenizer.get_vocab()
    for candidate in PAD_CANDIDATES:
        if candidate in vocab and vocab[candidate] not in avoid:
            tokenizer.pad_token = candidate
            return candidate
    raise TemplateError(f"the tokenizer's pad token {tokenizer.pad_token!r} is an end-of-turn token and none of "
                        f"{PAD_CANDIDATES} is in its vocabulary; add a pad token to the tokenizer first")
