"""Generates examples/papers.jsonl (and examples/updates/) once, from a fixed seed.

Realistic extraction output of ~200 scientific papers: methods, datasets, people, organizations,
tasks and metrics written the way extractors write them (case, punctuation and spacing variants,
aliases such as "BERT" / "Bidirectional Encoder Representations from Transformers", occasional
typos), predicates in many phrasings, and a few deliberately bad items so a run's summary shows
rejects. Run: ``python examples/make_examples.py [--papers N] [--seed S] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

ENTITIES: dict[str, list[list[str]]] = {
    "method": [
        ["BERT", "Bidirectional Encoder Representations from Transformers", "bert", "B.E.R.T."],
        ["Transformer", "transformer", "Transformer architecture"],
        ["ResNet-50", "ResNet 50", "resnet50"],
        ["LSTM", "Long Short-Term Memory", "long short-term memory", "LSTMs"],
        ["Adam", "Adam optimizer", "ADAM"],
        ["dropout", "Dropout"],
        ["GPT-2", "GPT2", "gpt-2"],
        ["word2vec", "Word2Vec", "word2Vec"],
        ["GloVe", "Glove", "GLoVe"],
        ["XGBoost", "xgboost", "XG-Boost"],
        ["Random Forest", "random forests", "random forest"],
        ["Support Vector Machine", "SVM", "support vector machines"],
        ["U-Net", "UNet", "U Net"],
        ["YOLOv5", "YOLO v5", "yolov5"],
        ["Graph Convolutional Network", "GCN", "graph convolutional networks"],
        ["Variational Autoencoder", "VAE", "variational auto-encoder"],
        ["AlphaFold", "Alpha Fold", "AlphaFold2"],
        ["CRISPR-Cas9", "CRISPR/Cas9", "CRISPR Cas9"],
        ["Stochastic Gradient Descent", "SGD", "stochastic gradient descent"],
        ["Batch Normalization", "BatchNorm", "batch normalisation"],
        ["RoBERTa", "Roberta", "roBERTa"],
        ["Vision Transformer", "ViT", "vision transformers"],
        ["Low-Rank Adaptation", "LoRA", "low rank adaptation"],
        ["Monte Carlo Dropout", "MC Dropout", "MC-dropout"],
    ],
    "dataset": [
        ["ImageNet", "ImageNet-1k", "imagenet", "ILSVRC-2012"],
        ["CIFAR-10", "CIFAR10", "cifar-10"],
        ["MNIST", "mnist"],
        ["SQuAD", "SQuAD v1.1", "Stanford Question Answering Dataset"],
        ["GLUE", "GLUE benchmark", "glue"],
        ["MS COCO", "COCO", "Microsoft COCO"],
        ["Penn Treebank", "PTB", "penn tree bank"],
        ["WikiText-103", "Wikitext-103", "WikiText103"],
        ["UK Biobank", "UK BioBank", "UKB"],
        ["MIMIC-III", "MIMIC III", "mimic-iii"],
        ["LibriSpeech", "Librispeech", "LibriSpeech corpus"],
        ["Common Crawl", "CommonCrawl", "common crawl"],
    ],
    "task": [
        ["image classification", "Image Classification"],
        ["named entity recognition", "NER", "Named-Entity Recognition"],
        ["machine translation", "Machine Translation", "MT"],
        ["question answering", "Question Answering", "QA"],
        ["protein structure prediction", "Protein Structure Prediction"],
        ["sentiment analysis", "Sentiment Analysis"],
        ["object detection", "Object Detection"],
        ["speech recognition", "automatic speech recognition", "ASR"],
    ],
    "metric": [
        ["accuracy", "Accuracy", "top-1 accuracy"],
        ["F1 score", "F1", "F1-score", "F-1"],
        ["BLEU", "BLEU score", "bleu"],
        ["perplexity", "Perplexity", "PPL"],
        ["AUC", "area under the ROC curve", "AUROC"],
        ["mean average precision", "mAP", "mean Average Precision"],
        ["word error rate", "WER", "Word Error Rate"],
    ],
    "person": [
        ["Geoffrey Hinton", "Geoffrey E. Hinton", "G. Hinton", "Geoffrey  Hinton"],
        ["Yoshua Bengio", "Y. Bengio", "yoshua bengio"],
        ["Yann LeCun", "Yann Le Cun", "Y. LeCun"],
        ["Fei-Fei Li", "Fei Fei Li", "Li Fei-Fei"],
        ["Jennifer Doudna", "Jennifer A. Doudna", "J. Doudna"],
        ["Emmanuelle Charpentier", "E. Charpentier"],
        ["Demis Hassabis", "D. Hassabis"],
        ["Andrew Ng", "Andrew Y. Ng", "A. Ng"],
        ["Ashish Vaswani", "A. Vaswani"],
        ["Jacob Devlin", "J. Devlin"],
        ["Kaiming He", "K. He"],
        ["Ilya Sutskever", "I. Sutskever"],
        ["Daphne Koller", "D. Koller"],
        ["Regina Barzilay", "R. Barzilay"],
        ["Percy Liang", "P. Liang"],
        ["Christopher D. Manning", "Christopher Manning", "C. D. Manning"],
        ["Timnit Gebru", "T. Gebru"],
        ["Oriol Vinyals", "O. Vinyals"],
        ["José Hernández-Orallo", "Jose Hernandez-Orallo", "J. Hernández-Orallo"],
        ["Zoë Kravitz-Lee", "Zoe Kravitz-Lee"],
        ["Mei Chen", "M. Chen"],
        ["Ming Chen", "M. Chen"],
    ],
    "organization": [
        ["Google Research", "Google research", "Google Brain"],
        ["DeepMind", "Google DeepMind", "Deep Mind"],
        ["Stanford University", "Stanford Univ.", "stanford university"],
        ["Massachusetts Institute of Technology", "MIT", "M.I.T."],
        ["University of Toronto", "Univ. of Toronto", "U of T"],
        ["Université de Montréal", "Universite de Montreal", "University of Montreal"],
        ["Mila", "MILA", "Mila - Quebec AI Institute"],
        ["Meta AI", "Facebook AI Research", "FAIR"],
        ["OpenAI", "Open AI", "openai"],
        ["Allen Institute for AI", "AI2", "Allen Institute for Artificial Intelligence"],
        ["ETH Zürich", "ETH Zurich", "ETH Zuerich"],
        ["Carnegie Mellon University", "CMU", "Carnegie-Mellon University"],
        ["Tsinghua University", "Tsinghua Univ."],
        ["National Institutes of Health", "NIH", "N.I.H."],
        ["Broad Institute", "Broad Institute of MIT and Harvard"],
    ],
}

PREDICATES: dict[tuple[str, str], list[str]] = {
    ("method", "dataset"): ["evaluated on", "evaluated_on", "tested on", "benchmarked on",
                            "trained on", "pre-trained on"],
    ("method", "method"): ["uses", "makes use of", "outperforms", "improves upon", "extends",
                           "builds on", "compared to", "inspired by"],
    ("method", "task"): ["applied to", "used for", "addresses"],
    ("method", "metric"): ["measured by", "evaluated with", "scored by"],
    ("person", "organization"): ["affiliated with", "works at", "affiliated_with", "member of"],
    ("method", "person"): ["authored by", "introduced by", "proposed by"],
    ("dataset", "method"): ["is used by", "used by"],
    ("organization", "person"): ["has member"],
}

QUOTES = [
    "In Table {n}, {s} {p} {o}.",
    "Our experiments show that {s} {p} {o}.",
    "As shown in Section {n}, {s} {p} {o}.",
    "{s} {p} {o} (see Figure {n}).",
]


def vary(name: str, rng: random.Random) -> str:
    """A real-world spelling of ``name``: mostly as is, sometimes with case, spacing or a typo."""
    r = rng.random()
    if r < 0.70:
        return name
    if r < 0.78:
        return name.lower()
    if r < 0.83:
        return name.upper() if len(name) < 12 else name.title()
    if r < 0.88:
        return " " + name.replace(" ", "  ") + " "
    if r < 0.92:
        return name.replace("-", " ") if "-" in name else name.replace(" ", "-")
    if r < 0.96 and len(name) >= 8:
        i = rng.randrange(1, len(name) - 2)
        if name[i].isalpha() and name[i + 1].isalpha():
            return name[:i] + name[i + 1] + name[i] + name[i + 2:]
        return name
    return name + "."


def make_paper(i: int, rng: random.Random) -> dict[str, Any]:
    paper_id = (f"arXiv:{rng.randint(15, 24)}{rng.randint(1, 12):02d}.{i:05d}"
                if i % 3 else f"doi:10.{rng.randint(1000, 9999)}/paper.{i:05d}")
    chosen: dict[str, list[str]] = {}
    counts = {"method": rng.randint(2, 4), "dataset": rng.randint(1, 3), "task": 1,
              "metric": rng.randint(1, 2), "person": rng.randint(2, 5),
              "organization": rng.randint(1, 3)}
    mentions: list[dict[str, Any]] = []
    offset = 0
    for etype, n in counts.items():
        for entity in rng.sample(ENTITIES[etype], n):
            text = vary(rng.choice(entity), rng)
            mid = f"m{len(mentions) + 1}"
            mention: dict[str, Any] = {"id": mid, "text": text, "type": etype}
            if rng.random() < 0.8:
                mention["span"] = [offset, offset + len(text)]
            offset += len(text) + rng.randint(20, 400)
            mentions.append(mention)
            chosen.setdefault(etype, []).append(mid)
    by_id = {m["id"]: m for m in mentions}
    relationships: list[dict[str, Any]] = []
    pairs = [pair for pair in PREDICATES if pair[0] in chosen and pair[1] in chosen]
    for _ in range(rng.randint(4, 9)):
        st, ot = rng.choice(pairs)
        s, o = rng.choice(chosen[st]), rng.choice(chosen[ot])
        if s == o:
            continue
        predicate = rng.choice(PREDICATES[(st, ot)])
        rel: dict[str, Any] = {"subject": s, "predicate": predicate, "object": o}
        if rng.random() < 0.85:
            rel["confidence"] = round(rng.uniform(0.5, 1.0), 3)
        quote = rng.choice(QUOTES).format(s=by_id[s]["text"].strip(), o=by_id[o]["text"].strip(),
                                          p=predicate.replace("_", " "), n=rng.randint(1, 6))
        start = rng.randint(0, 40000)
        rel["evidence"] = {"span": [start, start + len(quote)], "quote": quote}
        relationships.append(rel)
    paper: dict[str, Any] = {"paper_id": paper_id}
    if rng.random() < 0.4:
        paper["revision"] = "v1"
    paper["mentions"] = mentions
    paper["relationships"] = relationships
    return paper


def spoil(paper: dict[str, Any], kind: str) -> None:
    """Adds one deliberately bad item (the rest of the paper stays good)."""
    rels = paper["relationships"]
    if kind == "string_confidence":
        rels.append({"subject": "m1", "predicate": "uses", "object": "m2", "confidence": "0.9"})
    elif kind == "out_of_range":
        rels.append({"subject": "m1", "predicate": "uses", "object": "m2", "confidence": 1.7})
    elif kind == "nan":
        rels.append({"subject": "m2", "predicate": "uses", "object": "m1",
                     "confidence": float("nan")})
    elif kind == "self_loop":
        rels.append({"subject": "m1", "predicate": "extends", "object": "m1"})
    elif kind == "dangling":
        rels.append({"subject": "m1", "predicate": "evaluated on", "object": "m99"})
    elif kind == "no_type":
        paper["mentions"].append({"id": "mx", "text": "an unnamed baseline"})
    elif kind == "empty_text":
        paper["mentions"].append({"id": "my", "text": "   ", "type": "method"})
    elif kind == "punctuation_only":
        paper["mentions"].append({"id": "mz", "text": "--", "type": "method"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--papers", type=int, default=200)
    parser.add_argument("--seed", type=int, default=20260101)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    papers = [make_paper(i, rng) for i in range(args.papers)]
    kinds = ["string_confidence", "out_of_range", "nan", "self_loop", "dangling", "no_type",
             "empty_text", "punctuation_only"]
    for kind, paper in zip(kinds, rng.sample(papers, len(kinds)), strict=True):
        spoil(paper, kind)
    lines = [json.dumps(p, ensure_ascii=False) for p in papers]
    lines.insert(len(lines) // 2, '{"paper_id": "broken-line", "mentions": [')  # not JSON
    lines.insert(len(lines) // 3, json.dumps({"paper_id": "bad-shape", "mentions": {"m1": "x"},
                                              "relationships": []}))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "papers.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # A later delivery: new revisions of a few papers (one relationship dropped, one added).
    updates = []
    for paper in rng.sample(papers[:150], 5):
        revised = json.loads(json.dumps(paper))
        revised["revision"] = "v2"
        revised["relationships"] = revised["relationships"][1:]
        revised["relationships"].append(
            {"subject": "m1", "predicate": "compared with", "object": "m2", "confidence": 0.6})
        updates.append(json.dumps(revised, ensure_ascii=False))
    (args.out / "updates").mkdir(exist_ok=True)
    (args.out / "updates" / "papers-v2.jsonl").write_text("\n".join(updates) + "\n",
                                                          encoding="utf-8")


if __name__ == "__main__":
    main()
