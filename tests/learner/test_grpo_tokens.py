"""Tokens and loss masks: exact ids when recorded, the chat template otherwise; single and multi-turn."""

from __future__ import annotations

import copy
import json
import math

import pytest

from learner.grpo.tokens import (
    CallRecord,
    TemplateNotPrefixPreserving,
    merge_calls,
    parse_call,
    template_call_tokens,
    trajectory_segments,
)
from tests.support.chat_templates import TOOL_TEMPLATE

# Not prefix-preserving: the generation prompt opens a block that rendered answers do not have.
THINK_TEMPLATE = TOOL_TEMPLATE.replace(
    "{% if add_generation_prompt %}<|im_start|>assistant\n",
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n",
)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from learner.models import load_tokenizer

    return load_tokenizer(smollm2_dir)


def response(prompt_ids, completions, logprobs=None, contents=None):
    choices = []
    for i, ids in enumerate(completions):
        lps = logprobs[i] if logprobs else [-0.5] * len(ids)
        choices.append(
            {
                "index": i,
                "message": {"role": "assistant", "content": (contents or ["x"] * 9)[i]},
                "token_ids": ids,
                "logprobs": {"content": [{"token": "t", "logprob": lp} for lp in lps]},
            }
        )
    return {"prompt_token_ids": prompt_ids, "choices": choices}


def test_exact_ids_single_turn_mask_and_behaviour_logprobs():
    call = parse_call(
        {"messages": [{"role": "user", "content": "hi"}]},
        response([1, 2, 3], [[7, 8, 2]], [[-0.1, -0.2, -0.3]]),
        temperature=0.7,
        version=None,
    )
    [segment] = trajectory_segments(None, [call])
    assert segment.input_ids == [1, 2, 3, 7, 8, 2]
    assert segment.loss_mask == [False, False, False, True, True, True]
    assert segment.behaviour_logprobs[3:] == [-0.1, -0.2, -0.3] and all(
        math.isnan(v) for v in segment.behaviour_logprobs[:3]
    )
    assert segment.temperature == 0.7 and segment.loss_tokens == 3


def test_exact_ids_multi_turn_merges_into_one_sequence_that_masks_only_assistant_turns():
    turn1 = parse_call(
        {"messages": [{"role": "user", "content": "a"}]}, response([1, 2], [[5, 6, 2]], [[-1, -2, -3]]), 1.0, None
    )
    # the next prompt = previous prompt + answer + a tool result / user turn (tokens 9, 9)
    turn2 = parse_call({"messages": []}, response([1, 2, 5, 6, 2, 9, 9], [[7, 2]], [[-4, -5]]), 1.0, None)
    [segment] = trajectory_segments(None, [turn1, turn2])
    assert segment.input_ids == [1, 2, 5, 6, 2, 9, 9, 7, 2]
    assert segment.loss_mask == [False, False, True, True, True, False, False, True, True]
    recorded = [v for v, on in zip(segment.behaviour_logprobs, segment.loss_mask, strict=True) if on]
    assert recorded == [-1, -2, -3, -4, -5]


def test_turns_that_do_not_extend_each_other_or_were_sampled_differently_stay_separate():
    turn1 = parse_call({"messages": []}, response([1, 2], [[5, 2]]), 1.0, None)
    rewritten = parse_call({"messages": []}, response([1, 2, 4, 9], [[7, 2]]), 1.0, None)  # history rewritten
    assert [s.input_ids for s in trajectory_segments(None, [turn1, rewritten])] == [[1, 2, 5, 2], [1, 2, 4, 9, 7, 2]]
    hotter = parse_call({"messages": []}, response([1, 2, 5, 2, 9], [[7, 2]]), 0.5, None)
    assert len(trajectory_segments(None, [turn1, hotter])) == 2, "one temperature per sequence"
    other_version = parse_call({"messages": []}, response([1, 2, 5, 2, 9], [[7, 2]]), 1.0, "v2")
    assert len(trajectory_segments(None, [turn1, other_version])) == 2


def test_the_choice_the_run_continued_with_is_the_one_trained_and_bad_logprobs_are_not_used():
    request = {"messages": [{"role": "user", "content": "q"}]}
    answer = response([1], [[5, 2], [6, 2]], contents=["first", "second"])
    following = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "second"}]}
    assert parse_call(request, answer, 1.0, None, following).completion_ids == [6, 2]
    assert parse_call(request, answer, 1.0, None, None).completion_ids == [5, 2]
    short = copy.deepcopy(answer)
    short["choices"][0]["logprobs"]["content"].pop()
    assert parse_call(request, short, 1.0, None).logprobs is None, "logprobs must align with the token ids"


def test_template_path_single_turn_matches_what_the_server_renders(tokenizer):
    messages = [{"role": "user", "content": "Say hi."}]
    call = CallRecord(messages=messages, tools=None, answer={"role": "assistant", "content": "Hi there!"})
    tokens = template_call_tokens(tokenizer, call)
    served = tokenizer(
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )["input_ids"]
    assert tokens.prompt_ids == served, "the prompt is exactly what the inference server would have seen"
    assert tokenizer.decode(tokens.completion_ids) == "Hi there!<|im_end|>", "ends at the sampled end-of-turn token"
    assert tokens.logprobs is None


def test_template_path_multi_turn_with_tool_calls_masks_every_assistant_turn_and_nothing_else(tokenizer):
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = TOOL_TEMPLATE
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    call_1 = [{"role": "user", "content": "Weather in Oslo?"}]
    tool_call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": json.dumps({"city": "Oslo"})}}
        ],
    }
    call_2 = call_1 + [tool_call, {"role": "tool", "tool_call_id": "c1", "content": "-3C, snow"}]
    final = {"role": "assistant", "content": "Cold and snowy."}
    calls = [CallRecord(call_1, tools, tool_call), CallRecord(call_2, tools, final)]
    [segment] = trajectory_segments(tokenizer, calls)
    masked = tokenizer.decode([t for t, on in zip(segment.input_ids, segment.loss_mask, strict=True) if on])
    assert masked == '<tool_call>weather({"city": "Oslo"})</tool_call><|im_end|>Cold and snowy.<|im_end|>'
    unmasked = tokenizer.decode([t for t, on in zip(segment.input_ids, segment.loss_mask, strict=True) if not on])
    assert "Weather in Oslo?" in unmasked and "-3C, snow" in unmasked and "<tool_call>" not in unmasked
    assert segment.behaviour_logprobs is None, "no recorded logprobs: the trainer recomputes them"


def test_a_template_that_is_not_prefix_preserving_is_refused(tokenizer):
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = THINK_TEMPLATE
    call = CallRecord([{"role": "user", "content": "x"}], None, {"role": "assistant", "content": "y"})
    with pytest.raises(TemplateNotPrefixPreserving):
        template_call_tokens(tokenizer, call)


def test_recorded_and_rendered_calls_do_not_merge():
    from learner.grpo.tokens import CallTokens

    a = CallTokens([1, 2], [5, 2], [-1.0, -1.0], 1.0, None)
    b = CallTokens([1, 2, 5, 2, 9], [7, 2], None, 1.0, None)
    assert len(merge_calls([a, b])) == 2
