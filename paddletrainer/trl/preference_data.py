"""Preference pairs packed as PaddleNLP packs them: one row ``prompt · chosen · rejected``, the two responses
sharing the prompt's positions (position ids restart after the prompt) and the rejected response not seeing the
chosen one (a dense mask, or FlashMask's start-row indices).

A raw example is ``{"src": [...], "tgt": [...], "response": [a, b], "sort": [sa, sb]}``: ``src`` one more turn
than ``tgt``, the response of the higher ``sort`` is the chosen one.
"""
from __future__ import annotations

import numpy as np

__all__ = ["check_preference_data", "preprocess_preference_data", "preference_collate_fn"]


def check_preference_data(data):
    """``data`` with ``src``/``tgt`` as lists and ``response``/``sort`` ordered chosen first; raises on a
    malformed example."""
    for key in ("src", "tgt"):
        if isinstance(data[key], str):
            data[key] = [data[key]]
    if len(data["src"]) != len(data["tgt"]) + 1:
        raise ValueError(f"a preference example needs one more src than tgt, got {len(data['src'])} and {len(data['tgt'])}")
    if len(data["response"]) != 2 or len(data["sort"]) != 2:
        raise ValueError(f"a preference example needs 2 responses and 2 sorts, got {len(data['response'])} and {len(data['sort'])}")
    if not data["response"][0] or not data["response"][1]:
        raise ValueError(f"a preference example has an empty response: {data}")
    if data["sort"][0] == data["sort"][1]:
        raise ValueError(f"a preference example's two sorts are equal: {data}")
    if data["sort"][1] > data["sort"][0]:
        data["response"], data["sort"] = data["response"][::-1], data["sort"][::-1]
    return data


def _ids(tokenizer, text, special):
    return tokenizer.encode(text.strip(), add_special_tokens=special)["input_ids"]


def _turns(data, tokenizer):
    """``[(src_ids, tgt_ids + eos)]`` per turn, the last turn's target being the chosen response."""
    targets = list(data["tgt"]) + [data["response"][0]]
    return [(_ids(tokenizer, src, True), _ids(tokenizer, tgt, False) + [tokenizer.eos_token_id])
            for src, tgt in zip(data["src"], targets)]


def _chat_parts(data, tokenizer):
    """Prompt, both responses and eos from the tokenizer's chat template."""
    chat = [[s.strip(), t.strip()] for s, t in zip(data["src"], list(data["tgt"]) + [data["response"][0]])]
    chosen_turns = tokenizer.encode_chat_inputs(chat)["conversations"]
    chat[-1][-1] = data["response"][1].strip()
    rejected_turns = tokenizer.encode_chat_inputs(chat)["conversations"]
    last_src = chosen_turns[-1][0]
    return (chosen_turns, last_src[:-1], last_src[-1:] + chosen_turns[-1][-1][:-1],
            last_src[-1:] + rejected_turns[-1][-1][:-1], chosen_turns[-1][-1][-1])


def _truncate(prompt, chosen, rejected, data_args):
    """Keep the prompt's tail, then cut the responses in proportion to their lengths."""
    if len(prompt) + len(chosen) + len(rejected) <= data_args.max_seq_len:
        return prompt, chosen, rejected
    prompt = prompt[-data_args.max_prompt_len:]
    if len(prompt) + len(chosen) + len(rejected) > data_args.max_seq_len:
        room = data_args.max_seq_len - len(prompt)
        chosen_room = int(len(chosen) / (len(chosen) + len(rejected)) * room)
        chosen, rejected = chosen[:chosen_room], rejected[:room - chosen_room]
    return prompt, chosen, rejected


def preprocess_preference_data(data, tokenizer, data_args, model_args):
    """One raw example (see the module docstring) as a packed row: ``input_ids``, ``position_ids``,
    ``response_0_labels`` (chosen), ``response_1_labels`` (rejected), ``response_indexs`` and the mask."""
    data = check_preference_data(data)
    if tokenizer.chat_template is not None:
        turns, prompt, chosen, rejected, eos = _chat_parts(data, tokenizer)
    else:
        turns, eos = _turns(data, tokenizer), tokenizer.eos_token_id
        prompt, last = turns[-1][0][:-1], turns[-1][0][-1:]
        chosen = last + _ids(tokenizer, data["response"][0], False)
        rejected = last + _ids(tokenizer, data["response"][1], False)
    prompt, chosen, rejected = _truncate(prompt, chosen, rejected, data_args)
    used = len(prompt) + len(chosen) + len(rejected)
    for src, tgt in reversed(turns[:-1]):  # earlier turns, newest first, while they fit
        if len(src) + len(tgt) > data_args.max_seq_len - used:
            break
        prompt, used = src + tgt + prompt, used + len(src) + len(tgt)
    n_prompt, n_chosen, n_rejected = len(prompt), len(chosen), len(rejected)
    length = n_prompt + n_chosen + n_rejected
    row = {
        "input_ids": prompt + chosen + rejected,
        "position_ids": list(range(n_prompt + n_chosen)) + list(range(n_prompt, n_prompt + n_rejected)),
        "response_0_labels": [0] * n_prompt + chosen[1:] + [eos] + [0] * n_rejected,
        "response_1_labels": [0] * (n_prompt + n_chosen) + rejected[1:] + [eos],
        "response_indexs": [n_prompt, n_prompt + n_chosen, length, data["sort"][0]],
    }
    if model_args.flash_mask:
        row["attn_mask_startend_row_indices"] = ([length] * n_prompt + [n_prompt + n_chosen] * n_chosen
                                                 + [length] * n_rejected)
    else:
        mask = np.tri(length, length, dtype=bool)
        mask[n_prompt + n_chosen:, n_prompt:n_prompt + n_chosen] = False  # rejected does not see chosen
        row["attention_mask"] = mask
    return row


def _pad(values, length):
    return list(values) + [0] * (length - len(values))


def preference_collate_fn(batch, max_seq_len=None, data_type="pairwise"):
    """Rows of :func:`preprocess_preference_data` (or packed streams of them) right-padded to ``max_seq_len``
    as numpy arrays; ``response_indexs`` gets the row number first. ``pairwise`` names the labels
    ``chosen_labels``/``rejected_labels``, otherwise ``response_labels``/``response_kl_labels``."""
    if max_seq_len is None:
        raise ValueError("preference_collate_fn needs max_seq_len")
    first = batch[0]
    flash = "attn_mask_startend_row_indices" in first
    if not flash and "attention_mask" not in first:
        raise ValueError("a preference row needs attention_mask or attn_mask_startend_row_indices")
    out = {k: [] for k in ("input_ids", "position_ids", "response_0_labels", "response_1_labels", "response_indexs")}
    masks = []
    for i, row in enumerate(batch):
        gap = max_seq_len - len(row["input_ids"])
        for key in ("input_ids", "position_ids", "response_0_labels", "response_1_labels"):
            out[key].append(_pad(row[key], max_seq_len))
        if flash:
            starts = row["attn_mask_startend_row_indices"]
            masks.append([list(starts) + [starts[-1]] * gap])
        else:
            masks.append(np.pad(row["attention_mask"], ((0, 0), (0, gap), (0, gap)), constant_values=False))
        for index in row["response_indexs"]:  # a packed stream holds several pairs
            out["response_indexs"].append([i] + (index[:-1] if data_type == "pairwise" else index))
    names = ("chosen_labels", "rejected_labels") if data_type == "pairwise" else ("response_labels", "response_kl_labels")
    out[names[0]], out[names[1]] = out.pop("response_0_labels"), out.pop("response_1_labels")
    result = {key: np.array(value) for key, value in out.items()}
    if flash:
        result["attn_mask_startend_row_indices"] = np.array(masks, dtype=np.int32)
    else:
        result["attention_mask"] = np.array(masks, dtype=bool)
    return result
