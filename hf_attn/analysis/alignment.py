"""Word alignment from cross-attention, scored against gold alignments (ReLA paper Section 5.3, Figure 4 and
Table 5; GMM paper Section 6.4, Table 7).

* Gold alignments in the Pharaoh format, one line per sentence pair: ``i-j`` = source word i is aligned to target
  word j (0-based, sure link), ``i?j`` or ``ipj`` = possible link.
* Subword attention becomes word attention as in the ReLA paper (after Zenkel et al. 2019): the weights to the
  subwords of one source word are summed, the rows of the subwords of one target word are averaged. A token that
  starts with "▁" (SentencePiece) or "Ġ" (byte BPE) starts a word; special tokens (EOS, padding) are dropped.
* Normal attention uses row t for target token t (the step that predicts it); shifted attention uses row t + 1
  (alpha[1:]: the step whose decoder input is token t, offsetting the decoder's start token).
* Each word of the target is aligned to the source word with the largest weight (Och & Ney 2003 scores):
  precision = |A & P| / |A|, recall = |A & S| / |S|, AER = 1 - (|A & S| + |A & P|) / (|A| + |S|).
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from ..errors import HfAttnInputError
from .stats import collect_attentions

WORD_START = ("\u2581", "\u0120")  # "▁" SentencePiece, "Ġ" byte-level BPE


def read_pharaoh(path) -> list[tuple[set, set]]:
    """``[(sure, possible)]`` per line of a Pharaoh file; links are ``(source word, target word)``, possible
    includes sure."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            sure, possible = set(), set()
            for item in line.split():
                sep = next((s for s in "-?p" if s in item), None)
                i, _, j = item.partition(sep or "-")
                if sep is None or not i.isdigit() or not j.isdigit():
                    raise HfAttnInputError(f"--gold-alignments {str(path)!r} line {n}: {item!r} is not a Pharaoh link; "
                                           "write 'i-j' (sure) or 'i?j' (possible), 0-based source-target word indices")
                possible.add((int(i), int(j)))
                if sep == "-":
                    sure.add((int(i), int(j)))
            out.append((sure, possible))
    return out


def word_index(tokens, specials=()) -> list[int]:
    """Word index of each subword token (-1 for special tokens): a token that starts with "▁"/"Ġ" or follows a
    special token starts a new word; the first real token always does."""
    out, word, prev_special = [], -1, True
    for tok in tokens:
        if tok in specials:
            out.append(-1)
            prev_special = True
            continue
        if word < 0 or prev_special or tok.startswith(WORD_START):
            word += 1
        out.append(word)
        prev_special = False
    return out


def merge_subwords(w: torch.Tensor, src_words: list[int], tgt_words: list[int]) -> torch.Tensor:
    """``[..., T, S]`` subword attention -> ``[..., T_w, S_w]`` word attention: sum over the source subwords of a
    word, mean over the target subwords of a word (tokens with index -1 are dropped)."""
    src, tgt = torch.tensor(src_words), torch.tensor(tgt_words)
    n_src, n_tgt = int(src.max()) + 1, int(tgt.max()) + 1
    to_src = (src[:, None] == torch.arange(n_src)[None, :]).to(w.dtype)  # [S, S_w]
    to_tgt = (tgt[:, None] == torch.arange(n_tgt)[None, :]).to(w.dtype)  # [T, T_w]
    to_tgt = to_tgt / to_tgt.sum(0, keepdim=True).clamp(min=1)
    return to_tgt.transpose(0, 1) @ w[..., : len(tgt_words), : len(src_words)] @ to_src


def argmax_alignment(w: torch.Tensor) -> set[tuple[int, int]]:
    """``{(source word, target word)}``: each target row of ``[T_w, S_w]`` linked to its largest weight (a row of
    zeros, null attention, links nothing)."""
    best = w.argmax(-1)
    return {(int(best[t]), t) for t in range(w.shape[0]) if w[t].max() > 0}


def counts(predicted: set, sure: set, possible: set) -> torch.Tensor:
    """``[|A|, |S|, |A & S|, |A & P|]`` (P includes S)."""
    possible = possible | sure
    return torch.tensor([len(predicted), len(sure), len(predicted & sure), len(predicted & possible)], dtype=torch.float64)


def scores(c: torch.Tensor) -> dict:
    """AER, precision and recall from summed `counts` (corpus level, as the papers report them)."""
    a, s, a_s, a_p = c.tolist()
    return {"aer": 1 - (a_s + a_p) / max(a + s, 1), "precision": a_p / max(a, 1), "recall": a_s / max(s, 1)}


def sentence_word_attention(model, tokenizer, source: str, target: str, shifted: bool) -> tuple[list, int, int]:
    """Word-level cross-attention of one pair, per decoder layer ``[H, T_w, S_w]`` (teacher forcing)."""
    enc = tokenizer(source, text_target=target, return_tensors="pt")
    attn = collect_attentions(model, enc["input_ids"], enc["attention_mask"], labels=enc["labels"])["cross"]
    specials = set(tokenizer.all_special_tokens)
    src_words = word_index(tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist()), specials)
    tgt_words = word_index(tokenizer.convert_ids_to_tokens(enc["labels"][0].tolist()), specials)
    layers = []
    for w in attn.weights:
        w = w[0]
        if shifted:  # row t + 1 for target token t; the last token (EOS) has no later row and is a special anyway
            w = torch.cat([w[:, 1:], torch.zeros_like(w[:, :1])], dim=1)
        layers.append(merge_subwords(w, src_words, tgt_words))
    return layers, max(src_words) + 1, max(tgt_words) + 1


def alignment_quality(model, tokenizer, sources, targets, gold, shifted: bool = False, progress: bool = False) -> dict:
    """Per decoder layer: AER / precision / recall of the layer attention (mean over heads) and of the best head
    (the head with the lowest corpus AER), plus AoL / AoH = their means over layers (ReLA paper Table 5).
    Pairs whose word counts disagree with the gold file (tokenisation) are skipped and counted."""
    if len(gold) < len(sources):
        raise HfAttnInputError(f"--gold-alignments has {len(gold)} lines for {len(sources)} sentence pairs; give one "
                               "Pharaoh line per pair, in the order of the test pairs (or lower --sentences)")
    per_layer = per_head = None
    skipped = 0
    for src, tgt, (sure, possible) in tqdm(list(zip(sources, targets, gold)), desc="alignment", disable=not progress):
        layers, n_src, n_tgt = sentence_word_attention(model, tokenizer, src, tgt, shifted)
        if n_src != len(src.split()) or n_tgt != len(tgt.split()):
            skipped += 1
            continue
        if per_layer is None:
            per_layer = torch.zeros(len(layers), 4, dtype=torch.float64)
            per_head = torch.zeros(len(layers), layers[0].shape[0], 4, dtype=torch.float64)
        for i, w in enumerate(layers):
            per_layer[i] += counts(argmax_alignment(w.mean(0)), sure, possible)
            for h in range(w.shape[0]):
                per_head[i, h] += counts(argmax_alignment(w[h]), sure, possible)
    if per_layer is None:
        raise HfAttnInputError("no sentence pair matched its gold alignment's word count; the gold file must align "
                               "the whitespace-separated words of the test pairs, one line per pair")
    rows = []
    for i in range(per_layer.shape[0]):
        heads = [scores(c) for c in per_head[i]]
        best = min(range(len(heads)), key=lambda h: heads[h]["aer"])
        rows.append({"layer": i, **scores(per_layer[i]), "best_head": best, "best_head_aer": heads[best]["aer"],
                     "head_aer": [h["aer"] for h in heads]})
    return {"shifted": shifted, "layers": rows, "AoL": sum(r["aer"] for r in rows) / len(rows),
            "AoH": sum(r["best_head_aer"] for r in rows) / len(rows), "sentences": len(sources) - skipped,
            "skipped": skipped}


def word_alignments(model, tokenizer, sources, targets, layer: int | None = None, shifted: bool = True) -> tuple[int, list]:
    """``(layer, Pharaoh lines)``: the word alignment ``i-j`` that the head-averaged cross-attention of decoder
    ``layer`` gives (default: the penultimate layer, or the only one), shifted attention by default, one line per pair."""
    lines = []
    for src, tgt in zip(sources, targets):
        layers, _, _ = sentence_word_attention(model, tokenizer, src, tgt, shifted)
        n = len(layers)
        index = layer if layer is not None else (-2 if n > 1 else -1)
        if not -n <= index < n:
            raise HfAttnInputError(f"--alignment_layer {layer}: the model has {n} decoder layers; give {-n}..{n - 1}")
        links = sorted(argmax_alignment(layers[index].mean(0)))
        lines.append(" ".join(f"{i}-{j}" for i, j in links))
    return index % n, lines
